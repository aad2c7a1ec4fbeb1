#!/usr/bin/env bash
# On a 2-GPU machine, from the repository root: the fifth held-out set, half on each GPU. Writes into $1.
set -u
out=${1:-.}
CUDA_VISIBLE_DEVICES=0 python3 benchmarks/calibrate.py benchmarks/jobs_heldout5_a.txt $out/h200_heldout5_a.jsonl --timeout 240 > $out/heldout5_a.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 python3 benchmarks/calibrate.py benchmarks/jobs_heldout5_b.txt $out/h200_heldout5_b.jsonl --timeout 240 > $out/heldout5_b.log 2>&1 &
wait
cat $out/h200_heldout5_*.jsonl
