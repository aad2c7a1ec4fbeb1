#!/usr/bin/env bash
# Third set of emulated-card max-batch checks (same method as max_batch_gpu.sh), chosen on 2026-11-30 after the
# day's estimator changes and measured without tuning on them; three jobs per GPU of a 2-GPU machine. JSON to $1.
set -u
out=${1:-.}
run() {  # gpu, name, gpu memory, workload...
  local gpu=$1 name=$2 mem=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu python3 -m gpuready trial "$@" --find-max batch --gpu-memory "$mem" --no-db --timeout 240 \
    --json > "$out/$name.json" 2>> "$out/log_$gpu.txt" || echo "exit $? for $name"
}
(
run 0 qwen05b_fp32_s1024_24 24GiB qwen2.5-0.5b --precision fp32 --seq 1024
run 0 gemma2b_lora_s1024_24 24GiB gemma-2-2b --method lora --seq 1024
run 0 llama3b_s1024_80 80GiB llama-3.2-3b --seq 1024
) &
(
run 1 mistral7b_lora_ckpt_s4096_24 24GiB mistral-7b --method lora --grad-ckpt --seq 4096
run 1 llama8b_lora_s1024_40 40GiB llama-3.1-8b --method lora --seq 1024
run 1 phi3_lora_s2048_40 40GiB phi-3-mini --method lora --seq 2048
) &
wait
for f in "$out"/*.json; do python3 -c "
import json,sys; d=json.load(open('$f')); print('$f'.split('/')[-1], 'max', d.get('max_value') or d.get('fit',{}) , [(p['values'].get('batch'), p['status']) for p in d.get('points',[])])"; done
