#!/usr/bin/env bash
# Largest batch that runs on emulated 24/40/80 GiB cards (gpuready trial --find-max batch --gpu-memory SIZE),
# to compare with the estimator's max_batch. Run on the GPU machine from the repository root; writes JSON to $1.
set -u
out=${1:-.}
run() {  # name, gpu memory, workload...
  local name=$1 mem=$2; shift 2
  echo "== $name ($mem): $*"
  python3 -m gpuready trial "$@" --find-max batch --gpu-memory "$mem" --no-db --timeout 240 --json > "$out/$name.json" \
    || echo "exit $? for $name"
}
run llama1b_s2048_24 24GiB llama-3.2-1b --seq 2048
run llama1b_s2048_40 40GiB llama-3.2-1b --seq 2048
run llama1b_s2048_80 80GiB llama-3.2-1b --seq 2048
run qwen15b_s1024_40 40GiB qwen2.5-1.5b --seq 1024
run resnet50_fp32_24 24GiB resnet50 --precision fp32
run llama8b_lora_ckpt_24 24GiB llama-3.1-8b --method lora --grad-ckpt --seq 2048
