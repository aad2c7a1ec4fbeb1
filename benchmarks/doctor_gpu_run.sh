#!/usr/bin/env bash
# The real runs of `gpuready doctor` on a GPU machine (issue 3's evidence). Writes into $OUT:
# healthy report (text + JSON), CUDA_VISIBLE_DEVICES= , LD_LIBRARY_PATH pointing at the system CUDA libraries,
# an env snapshot, the speed table, and the gpu-marked test. Run from the repository root with gpuready on
# PYTHONPATH.
set -u
OUT=${OUT:-/tmp/doctor-out}
mkdir -p "$OUT" /tmp/empty
SRC=$(python3 -c 'import gpuready,os;print(os.path.dirname(os.path.dirname(gpuready.__file__)))')
log="$OUT/run.log"
{
  echo "== $(date -u) $(uname -a)"; nproc; grep -m1 'model name' /proc/cpuinfo
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  ldconfig -p | grep -E 'libcudnn.so.9 |libcudart.so' || true
} >"$log" 2>&1
cd /tmp/empty
echo "== healthy (text)" >>"$log"
COLUMNS=220 python3 -m gpuready doctor >"$OUT/healthy.txt" 2>>"$log"; echo "exit $?" >>"$log"
python3 -m gpuready doctor --json >"$OUT/healthy.json" 2>>"$log"; echo "healthy json exit $?" >>"$log"
CUDA_VISIBLE_DEVICES= python3 -m gpuready doctor --json >"$OUT/cuda_visible_devices_empty.json" 2>>"$log"
echo "cvd exit $?" >>"$log"
SYSDIRS=$(ldconfig -p | awk '/libcudnn.so.9 |libcudart.so/ {print $NF}' | xargs -r -n1 dirname | sort -u | paste -sd:)
[ -d /usr/local/cuda/lib64 ] && SYSDIRS="${SYSDIRS:+$SYSDIRS:}/usr/local/cuda/lib64"
echo "system CUDA dirs: $SYSDIRS" >>"$log"
LD_LIBRARY_PATH="$SYSDIRS:${LD_LIBRARY_PATH:-}" python3 -m gpuready doctor --json >"$OUT/ld_library_path_system.json" 2>>"$log"
echo "ld exit $?" >>"$log"
python3 -m gpuready env snapshot -o "$OUT/snapshot.json" >>"$log" 2>&1
python3 "$SRC/../benchmarks/doctor_speed.py" --runs 3 >"$OUT/speed.md" 2>>"$log"
cd - >/dev/null
python3 -m pytest -q -m gpu -p no:cacheprovider "$SRC/../tests/doctor/test_cli.py" >>"$log" 2>&1
echo "gpu test exit $?" >>"$log"
