#!/usr/bin/env bash
# On a 2-GPU machine, from the repository root: the doctor's speed (fast path and with the live probe), and
# `gpuready trial --nproc 2` for the two multi-GPU calibration jobs (DDP and FSDP2). Writes into $1.
set -u
out=${1:-.}
for i in 1 2 3 4 5; do
  /usr/bin/time -f "doctor --fast %e s" python3 -m gpuready doctor --fast --json > "$out/doctor_fast.json" 2>>"$out/doctor_times.txt"
done
for i in 1 2; do
  /usr/bin/time -f "doctor (probe) %e s" python3 -m gpuready doctor --json > "$out/doctor_full.json" 2>>"$out/doctor_times.txt"
done
python3 -m gpuready trial llama-3.2-1b --batch 4 --seq 2048 --gpus 2 --shard ddp --nproc 2 --no-db --timeout 300 --json \
  > "$out/trial_ddp_llama1b.json" 2> "$out/trial_ddp.log"
python3 -m gpuready trial llama-3.1-8b --batch 1 --seq 2048 --grad-ckpt --gpus 2 --shard fsdp --nproc 2 --no-db \
  --timeout 300 --json > "$out/trial_fsdp_llama8b.json" 2> "$out/trial_fsdp.log"
cat "$out/doctor_times.txt"
