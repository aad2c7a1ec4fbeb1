#!/usr/bin/env bash
# Second round of recorded allocator histories (see gpu_history_checks.sh): generation jobs and the training rows
# whose estimate depends on how the driver places segments. Writes histories (tar.gz) into $1.
set -u
out=${1:-.}
h=/tmp/hist2; mkdir -p $h
t() { python3 -m gpuready trial "$@" --no-db --timeout 240 --json; }
rec() {
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu GPUREADY_PROBE_MEMORY_HISTORY=$h/$name.json t "$@" > $h/$name.result.json 2>> $h/log.txt
}
(
rec 0 gen_qwen05_b64 qwen2.5-0.5b --task infer --new-tokens 128 --batch 64 --seq 1024 --precision bf16
rec 0 gen_llama1b_fp16 llama-3.2-1b --task infer --new-tokens 64 --batch 32 --seq 512 --precision fp16
rec 0 gen_qwen7b_fp16 qwen2.5-7b --task infer --new-tokens 256 --batch 16 --seq 1024 --precision fp16
rec 0 gen_llama8b_b8 llama-3.1-8b --task infer --new-tokens 128 --batch 8 --seq 2048 --precision bf16
) &
(
rec 1 ft_llama8b_b2 llama-3.1-8b --task train --batch 2 --seq 1024 --precision bf16
rec 1 lora_qwen3_8b_ckpt qwen3-8b --task train --method lora --lora-r 32 --batch 1 --seq 4096 --precision bf16 --grad-ckpt
rec 1 ft_gpt2l_mixed gpt2-large --task train --batch 4 --seq 1024 --precision mixed
rec 1 gen_deepseek deepseek-v2-lite --task infer --new-tokens 32 --batch 2 --seq 1024 --precision bf16
) &
wait
ls -la $h; cat $h/log.txt | tail -5
(cd $h && tar czf $out/hist2_a.tgz gen_qwen05_b64.json gen_llama1b_fp16.json)
(cd $h && tar czf $out/hist2_b.tgz gen_qwen7b_fp16.json gen_llama8b_b8.json)
(cd $h && tar czf $out/hist2_c.tgz ft_llama8b_b2.json lora_qwen3_8b_ckpt.json)
(cd $h && tar czf $out/hist2_d.tgz ft_gpt2l_mixed.json gen_deepseek.json *.result.json)
ls -la $out
