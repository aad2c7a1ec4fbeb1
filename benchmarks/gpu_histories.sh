#!/usr/bin/env bash
# Record the caching allocator's history of GPU jobs (GPUREADY_PROBE_MEMORY_HISTORY) for
# benchmarks/allocator_check.py, which replays them through gpuready's allocator model.
#
#   bash benchmarks/gpu_histories.sh OUT LIST [LIST ...]
#
# From the repository root on a GPU machine. Each LIST is a job list (benchmarks/histories/*.txt): one job per
# line, `NAME gpuready-trial-arguments...`; '#' starts a comment. The first LIST runs on GPU 0, the second on
# GPU 1, and so on, in parallel. A job with `--nproc N` runs after the lists, on N GPUs (each rank writes
# NAME.json.rank<r>). `LIST@G` runs that list on GPU G instead (several lists may share one GPU: their jobs must then
# be capped with --gpu-memory so that together they fit it). Writes into OUT: histories.tgz (the histories, results
# and log) and allocator_check.txt (with, for histories recorded under a cap, the replay under that cap).
set -u
out=${1:?usage: gpu_histories.sh OUT LIST [LIST ...]}; shift
h=$(mktemp -d /tmp/gpuready_hist.XXXX)
rec() {  # rec GPUS NAME ARGS...
  local gpus=$1 name=$2; shift 2
  echo "$(date +%T) $name on GPU $gpus" >> "$h/log.txt"
  CUDA_VISIBLE_DEVICES=$gpus GPUREADY_PROBE_MEMORY_HISTORY=$h/$name.json \
    python3 -m gpuready trial "$@" --no-db --timeout 240 --json > "$h/$name.result.json" 2>> "$h/log.txt"
}
multi=()
gpu=0
for spec in "$@"; do
  list=${spec%@*}
  [[ "$spec" == *@* ]] && gpu=${spec##*@}
  (
    while read -r name args; do
      case "$name" in ''|'#'*) continue ;; esac
      [[ " $args " == *" --nproc "* ]] && continue
      # shellcheck disable=SC2086
      rec "$gpu" "$name" $args
    done < "$list"
  ) &
  while read -r name args; do
    [[ " $args " == *" --nproc "* ]] && multi+=("$name $args")
  done < <(grep -v '^#' "$list")
  gpu=$((gpu + 1))
done
wait
all=$(seq -s, 0 $(($(nvidia-smi -L 2>/dev/null | grep -c "^GPU") - 1)))  # every GPU of the machine
for job in "${multi[@]+"${multi[@]}"}"; do
  # shellcheck disable=SC2086
  rec "$all" $job
done
mkdir -p "$out"
python3 benchmarks/allocator_check.py --table $(ls "$h"/*.json "$h"/*.json.rank* 2>/dev/null | grep -v result) \
  > "$out/allocator_check.txt" 2>&1
cat "$out/allocator_check.txt"
(cd "$h" && tar czf "$out/histories.tgz" ./*)
ls -la "$out"
