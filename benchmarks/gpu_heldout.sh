#!/usr/bin/env bash
# On a 2-GPU machine, from the repository root: a held-out set split over two job lists, one per GPU
# (benchmarks/jobs_NAME_a.txt on GPU 0, jobs_NAME_b.txt on GPU 1), measured by benchmarks/calibrate.py; then, if
# benchmarks/jobs_NAME_ddp.txt exists, its jobs under torchrun on both GPUs. Jobs marked `history=H` record the
# caching allocator's history (all of them land in $OUT/histories_NAME.tgz). Writes $OUT/h200_NAME_{a,b,ddp}.jsonl
# and the logs, and prints one line per job. On a 1-GPU machine the two lists run one after the other. Used for NAME = heldout3, heldout5, heldout6, heldout7, families2, families3, heldout9 (FSDP2 only: jobs_heldout9_ddp.txt).
#     bash benchmarks/gpu_heldout.sh heldout7 $OUT
set -u
name=$1
out=$(cd "${2:-.}" && pwd)
hist=/tmp/gpuready_hist_$name
mkdir -p "$hist"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
for half in a b; do
  [ -f "benchmarks/jobs_${name}_${half}.txt" ] || continue  # a set of 2-GPU jobs only (heldout9) has no a/b lists
  gpu=0; [ "$half" = b ] && [ "$gpus" -ge 2 ] && gpu=1
  CUDA_VISIBLE_DEVICES=$gpu python3 benchmarks/calibrate.py "benchmarks/jobs_${name}_${half}.txt" \
    "$out/h200_${name}_${half}.jsonl" --timeout 150 --history-dir "$hist" > "$out/${name}_${half}.log" 2>&1 &
  [ "$gpus" -ge 2 ] || wait  # one GPU: the two lists one after the other
done
wait
if [ -f "benchmarks/jobs_${name}_ddp.txt" ]; then
  CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/calibrate.py "benchmarks/jobs_${name}_ddp.txt" \
    "$out/h200_${name}_ddp.jsonl" --timeout 150 --nproc 2 --history-dir "$hist" >> "$out/${name}_ddp.log" 2>&1
fi
if [ -n "$(ls -A "$hist")" ]; then
  (cd "$hist" && tar czf "$out/histories_${name}.tgz" ./*)
fi
cat "$out"/"${name}"_*.log
