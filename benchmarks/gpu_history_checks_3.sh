#!/usr/bin/env bash
# Histories of the two jobs the third emulated-card set over-promised (benchmarks/jobs_max_batch_1.txt, then max_batch_gpu_3.sh): phi-3-mini
# LoRA without checkpointing (allocated under-predicted) and llama-3.2-3b at batch 11 (a fragmentation cliff).
# Writes the histories (tar.gz) and the trial JSON into $1.
set -u
out=${1:-.}
h=/tmp/hist4; mkdir -p $h
t() { python3 -m gpuready trial "$@" --no-db --timeout 240 --json; }
GPUREADY_PROBE_MEMORY_HISTORY=$h/lora_phi3_b1.json t phi-3-mini --method lora --batch 1 --seq 2048 > $h/lora_phi3_b1.result.json
GPUREADY_PROBE_MEMORY_HISTORY=$h/ft_llama3b_b11.json t llama-3.2-3b --batch 11 --seq 1024 > $h/ft_llama3b_b11.result.json
(cd $h && tar czf $out/hist4.tgz *.json)
python3 benchmarks/allocator_check.py $h/lora_phi3_b1.json $h/ft_llama3b_b11.json > $out/allocator_check.txt 2>&1
cat $out/allocator_check.txt
