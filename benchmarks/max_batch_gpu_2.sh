#!/usr/bin/env bash
# Two more emulated-card checks for docs/max_batch.md (same method as max_batch_gpu.sh). Writes JSON to $1.
set -u
out=${1:-.}
python3 -m gpuready trial llama-3.1-8b --method lora --seq 2048 --find-max batch --gpu-memory 80GiB --no-db \
  --timeout 100 --json > "$out/llama8b_lora_s2048_80.json" || true
python3 -m gpuready trial qwen2.5-7b --method lora --grad-ckpt --seq 1024 --find-max batch --gpu-memory 40GiB \
  --no-db --timeout 100 --json > "$out/qwen7b_lora_ckpt_s1024_40.json" || true
