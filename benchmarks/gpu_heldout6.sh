#!/usr/bin/env bash
# On a 2-GPU machine, from the repository root: the sixth held-out set, half on each GPU. Writes into $1.
set -u
out=${1:-.}
CUDA_VISIBLE_DEVICES=0 python3 benchmarks/calibrate.py benchmarks/jobs_heldout6_a.txt $out/h200_heldout6_a.jsonl --timeout 240 > $out/heldout6_a.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 python3 benchmarks/calibrate.py benchmarks/jobs_heldout6_b.txt $out/h200_heldout6_b.jsonl --timeout 240 > $out/heldout6_b.log 2>&1 &
wait
cat $out/h200_heldout6_*.jsonl
