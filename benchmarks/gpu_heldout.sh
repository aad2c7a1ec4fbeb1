#!/usr/bin/env bash
# On a 2-GPU machine, from the repository root: a held-out set split over two job lists, one per GPU
# (benchmarks/jobs_NAME_a.txt on GPU 0, jobs_NAME_b.txt on GPU 1), measured by benchmarks/calibrate.py.
# Writes $OUT/h200_NAME_{a,b}.jsonl and their logs. Used for NAME = heldout3, heldout5, heldout6.
#     bash benchmarks/gpu_heldout.sh heldout6 $OUT
set -u
name=$1
out=${2:-.}
for half in a b; do
  gpu=0; [ "$half" = b ] && gpu=1
  CUDA_VISIBLE_DEVICES=$gpu python3 benchmarks/calibrate.py "benchmarks/jobs_${name}_${half}.txt" \
    "$out/h200_${name}_${half}.jsonl" --timeout 240 > "$out/${name}_${half}.log" 2>&1 &
done
wait
cat "$out"/h200_"${name}"_*.jsonl
