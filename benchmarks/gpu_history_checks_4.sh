#!/usr/bin/env bash
# Histories of autocast (mixed) training jobs and Gemma-2 full fine-tuning, the kinds whose layers still use the
# coarser program (docs/accuracy.md). Two jobs per GPU of a 2-GPU machine; histories (tar.gz) into $1.
set -u
out=${1:-.}
h=/tmp/hist5; mkdir -p $h
rec() {
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu GPUREADY_PROBE_MEMORY_HISTORY=$h/$name.json python3 -m gpuready trial "$@" --no-db \
    --timeout 240 --json > $h/$name.result.json 2>> $h/log.txt
}
(
rec 0 ft_llama1b_mixed llama-3.2-1b --task train --batch 4 --seq 2048 --precision mixed
rec 0 ft_llama1b_mixed_ckpt llama-3.2-1b --task train --batch 4 --seq 2048 --precision mixed --grad-ckpt
) &
(
rec 1 ft_qwen3b_mixed qwen2.5-3b --task train --batch 2 --seq 1024 --precision mixed
rec 1 ft_gemma2b_bf16 gemma-2-2b --task train --batch 2 --seq 1024 --precision bf16
) &
wait
python3 benchmarks/allocator_check.py --table $(ls $h/ft_*.json | grep -v result)
(cd $h && tar czf $out/hist5.tgz ft_*.json)
ls -la $out
