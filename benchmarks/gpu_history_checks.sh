#!/usr/bin/env bash
# On a 2-GPU machine, from the repository root: record the caching allocator's history of the jobs the
# estimator missed most, and of the DDP and FSDP2 rows (benchmarks/allocator_check.py replays them through
# gpuready's allocator model). Writes the reports and the histories (tar.gz) into $1.
set -u
out=${1:-.}
h=/tmp/hist; mkdir -p $h
t() { python3 -m gpuready trial "$@" --no-db --timeout 240 --json; }
rec() {  # rec GPU NAME ARGS... : one single-GPU job with its allocator history
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu GPUREADY_PROBE_MEMORY_HISTORY=$h/$name.json t "$@" > $h/$name.result.json 2>> $h/log.txt
}
(
rec 0 ft_qwen05_fp32 qwen2.5-0.5b --task train --batch 4 --seq 1024 --precision fp32
rec 0 ft_gpt2m_fp16 gpt2-medium --task train --batch 4 --seq 1024 --precision fp16
rec 0 ft_qwen15_bf16 qwen2.5-1.5b --task train --batch 4 --seq 1024 --precision bf16
rec 0 ft_gpt2xl_sgd gpt2-xl --task train --optim sgd --batch 1 --seq 1024 --precision fp32
rec 0 vit_l_mixed vit_l_16 --task train --batch 32 --image-size 224 --precision mixed
) &
(
rec 1 ft_qwen3_4b qwen3-4b --task train --batch 1 --seq 1024 --precision bf16
rec 1 lora_gemma2_2b gemma-2-2b --task train --method lora --batch 2 --seq 1024 --precision bf16
rec 1 lora_phi3_ckpt phi-3-mini --task train --method lora --batch 1 --seq 2048 --precision bf16 --grad-ckpt
rec 1 lora_llama8b_b1 llama-3.1-8b --task train --method lora --lora-r 16 --batch 1 --seq 2048 --precision bf16
) &
wait
GPUREADY_PROBE_MEMORY_HISTORY=$h/ddp_llama1b.json t llama-3.2-1b --batch 4 --seq 2048 --gpus 2 --shard ddp --nproc 2 \
  > $h/ddp_llama1b.result.json 2>> $h/log.txt
GPUREADY_PROBE_MEMORY_HISTORY=$h/fsdp_llama8b.json t llama-3.1-8b --batch 1 --seq 2048 --grad-ckpt --gpus 2 --shard fsdp \
  --nproc 2 > $h/fsdp_llama8b.result.json 2>> $h/log.txt
ls -la $h
python3 benchmarks/allocator_check.py $(ls $h/*.json* | grep -v result) > $out/allocator_check.txt 2>&1
python3 benchmarks/allocator_check.py --table $(ls $h/*.json* | grep -v result) > $out/allocator_table.md 2>&1
cat $out/allocator_check.txt
(cd $h && tar czf $out/hist_a.tgz ft_qwen05_fp32.json ft_gpt2m_fp16.json ft_qwen15_bf16.json ft_gpt2xl_sgd.json vit_l_mixed.json)
(cd $h && tar czf $out/hist_b.tgz ft_qwen3_4b.json lora_gemma2_2b.json lora_phi3_ckpt.json lora_llama8b_b1.json)
(cd $h && tar czf $out/hist_c.tgz ddp_llama1b.json.rank* fsdp_llama8b.json.rank* *.result.json log.txt)
ls -la $out
