#!/usr/bin/env bash
# On the 2 x H200 machine, from the repository root: the step-time held-out set (docs/steptime.md).
# 1. two single-GPU job lists in parallel (benchmarks/jobs_steptime_a.txt on GPU 0, _b on GPU 1);
# 2. the 2-GPU jobs (jobs_steptime_x2.txt) one torchrun each, then NCCL's all-gather/all-reduce bandwidth.
# Each job: benchmarks/calibrate.py (fresh process, step_seconds = median of the steps after the first);
# GPUREADY_PROBE_STEPS=4 gives three steady steps. Whole run bounded to 235 s (125 + 80 + 30; a list cut
# short keeps the rows it wrote). Writes $OUT/steptime_h200_new_{a,b,x2}.jsonl, nccl.json, logs.
#     bash benchmarks/steptime_gpu.sh $OUT
set -u
out=${1:-.}
export GPUREADY_PROBE_STEPS=4
for half in a b; do
  gpu=0; [ "$half" = b ] && gpu=1
  CUDA_VISIBLE_DEVICES=$gpu timeout 125 python3 benchmarks/calibrate.py "benchmarks/jobs_steptime_${half}.txt" \
    "$out/steptime_h200_new_${half}.jsonl" --timeout 90 > "$out/steptime_${half}.log" 2>&1 &
done
wait
timeout 80 python3 benchmarks/calibrate.py benchmarks/jobs_steptime_x2.txt "$out/steptime_h200_new_x2.jsonl" \
  --nproc 2 --timeout 60 > "$out/steptime_x2.log" 2>&1
timeout 30 python3 -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/steptime.py \
  --nccl "$out/nccl.json" >> "$out/steptime_x2.log" 2>&1
cat "$out"/steptime_h200_new_*.jsonl "$out/nccl.json"
