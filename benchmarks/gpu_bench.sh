#!/usr/bin/env bash
# `gpuready bench` on the device machine (2 x NVIDIA H200), as two platforms: "1xH200" (GPU 0 alone) and
# "2xH200" (both GPUs, the same job under torchrun with DDP), each for --minutes 1, then `gpuready compare`.
#
# Usage, from the repository root (gpuready importable as `python3 -m gpuready`):
#   bash benchmarks/gpu_bench.sh OUT [MINUTES]
# Writes OUT/bench_1xh200.json, OUT/bench_2xh200.json (the records), their console views (.txt), and
# OUT/compare.txt, OUT/compare.html. 154 s on the device machine on 2026-11-30 (74 s + 79 s; the job is 60 s of
# each, gpuready start to first step 11-14 s, disk test ~3 s). Predictions made before the run: docs/bench/predicted.txt.
set -uo pipefail
OUT=${1:?usage: bash benchmarks/gpu_bench.sh OUT [MINUTES]}
MINUTES=${2:-1}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export GPUREADY_DB="$WORK/results.db"  # the bench rows go to a scratch database, not the user's
PY=${PYTHON:-python3}
t0=$(date +%s)

run() {  # NAME LABEL CUDA_VISIBLE_DEVICES [bench flags...]
  local name=$1 label=$2 devices=$3
  shift 3
  local s=$(date +%s)
  # both platforms are the same machine, benched one after the other: time to ready counts from each bench's
  # own start (--ordered-at now), not from the machine's start, which would charge the second the first's run
  CUDA_VISIBLE_DEVICES=$devices "$PY" -m gpuready bench --minutes "$MINUTES" --label "$label" \
    --ordered-at "$s" --disk-path "$WORK" --disk-size 256MiB -o "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "exit status $rc, $(( $(date +%s) - s )) s" >>"$OUT/$name.txt"
  echo "$name: exit $rc in $(( $(date +%s) - s )) s"
}

run bench_1xh200 1xH200 0
run bench_2xh200 2xH200 0,1 --nproc 2
"$PY" -m gpuready compare "$OUT/bench_1xh200.json" "$OUT/bench_2xh200.json" --html "$OUT/compare.html" \
  >"$OUT/compare.txt" 2>&1
echo "compare: exit $?"
# the bench rows in the scratch database (migration 3): one per record
"$PY" - "$GPUREADY_DB" <<'PYEOF'
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("SELECT label, gpu, gpu_count, status, median_per_second FROM benches").fetchall()
print("database rows:", rows)
PYEOF
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("bench_*.json")):
    r = json.loads(path.read_text())
    tp, h, m = r["throughput"], r["health"], r["memory"]
    print(
        f"{path.name}: {r['status']} {r['error'] or ''} | ready {r['ready']['seconds']} s from {r['ready']['reference']}"
        f" (bench start to first step {r['ready']['bench_seconds']}) | doctor ready={r['doctor']['ready']}"
        f" | {tp['effective_per_second']} {tp['unit']}/s effective, median {tp['median_per_second']},"
        f" spread {tp['spread']}, stable {tp['stable_seconds']} of {tp['ran_seconds']} s, {tp['steps']} steps"
        f" | SM {h['sm_clock_mhz_median']}/{h['max_sm_clock_mhz']} MHz, {h['power_watts_median']} W,"
        f" throttle {h['throttle_seconds']}, xid {h['xid_events']} (listening: {h['xid_supported']}),"
        f" ECC new {h['ecc_corrected_new']}/{h['ecc_uncorrected_new']}"
        f" | peak device {m['peak_device_bytes']} B | disk {r['disk']}"
        f" | price {r['price']['per_hour']}"
    )
PYEOF
tail -n 12 "$OUT/compare.txt"
echo "total $(( $(date +%s) - t0 )) s"
