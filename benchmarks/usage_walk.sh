#!/usr/bin/env bash
# The walk through docs/usage.md as a new user meets it: a fresh venv with `pip install -e .` only (no torch, no
# extras), a fresh project folder, an empty results database, 80 columns. Writes the transcript ("$ command",
# its stdout and stderr, its exit code) to OUT.
#
#   python3 -m venv /tmp/fc_venv && /tmp/fc_venv/bin/pip install -e .
#   bash benchmarks/usage_walk.sh /tmp/fc_venv docs/usage_walk.txt
set -u
VENV=${1:?usage: usage_walk.sh VENV OUT}
OUT=${2:?usage: usage_walk.sh VENV OUT}
OUT=$(realpath -m "$OUT")
WORK=$(mktemp -d /tmp/gpuready-walk.XXXXXX)
export PATH="$VENV/bin:$PATH" COLUMNS=80 XDG_DATA_HOME="$WORK/data" HF_HUB_CACHE="$WORK/hf"
unset HF_HUB_OFFLINE
cd "$WORK" || exit 1
mkdir -p outputs && printf 'step 10\n' > outputs/log.txt && printf 'weights' > outputs/adapter.bin
printf 'torch>=2.5\ntransformers>=4.46\npeft\n' > requirements.txt
printf 'import time\ntime.sleep(1)\n' > train.py

{
  echo "# $(date -u +%Y-%m-%d) on $(uname -n): $(nproc) cores, no GPU; $("$VENV/bin/python" --version);"
  echo "# venv $VENV with only \`pip install -e .\` (no torch); COLUMNS=80; in a fresh folder"
} > "$OUT"

step() {
  echo >> "$OUT"
  echo "\$ $*" >> "$OUT"
  bash -c "$*" >> "$OUT" 2>&1
  echo "[exit $?]" >> "$OUT"
}

step gpuready --version
step gpuready models
step gpuready gpus
step gpuready estimate qwen2.5-7b --method lora --seq 4096 --batch 2 --gpu A100-40GB
step gpuready estimate qwen2.5-7b --method lora --seq 4096 --batch 2 --gpu-memory 24
step gpuready estimate qwen2.5-7b --method lora --seq 4096 --batch 2 --gpu-memory 80GB --json "| grep -E '^  \"(gpu_memory_bytes|fits|max_batch)\"'"
step gpuready estimate gpt2 --seq 4096
step gpuready estimate qwen2.5-7b --method lora --lora-targets q_proj,foo
step gpuready estimate Qwen/Qwen2.5-14B-Instruct
step gpuready plan qwen2.5-7b --method lora --seq 4096 --grad-ckpt --tokens 50000000
step gpuready plan qwen2.5-7b --method lora --seq 4096 --grad-ckpt --hours 0
step gpuready check qwen2.5-7b --method lora --seq 4096 --grad-ckpt --gpu L4 --requirements requirements.txt
step gpuready doctor --requirements requirements.txt
step gpuready image --requirements requirements.txt --gpu H100
step gpuready env snapshot -o snapshot.json
step gpuready env snapshot -o /nonexistent/dir/snapshot.json
step gpuready trial qwen2.5-7b --method lora --seq 4096 --grad-ckpt --find-max batch
step gpuready trial --sweep-arg --batch_size=4,8,16 -- python train.py --max_steps 10
step gpuready history
step gpuready history --kind banana
step gpuready storage --fast
step "gpuready manifest create outputs/ -o outputs/MANIFEST.b3 && gpuready manifest verify outputs/MANIFEST.b3"
step "gpuready manifest verify outputs/MANIFEST.b3 ."
step gpuready sync outputs/ backup/
rm -rf "$WORK"
