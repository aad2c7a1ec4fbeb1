"""How long `gpuready doctor` takes, fast path and with the live probe, next to the probe alone;
and proof from `python -X importtime` that the CLI process never imports torch. Prints a markdown table.

    PYTHONPATH=$PWD/src python benchmarks/doctor_speed.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time


def wall(argv: list[str]) -> tuple[float, int]:
    t = time.perf_counter()
    rc = subprocess.run(argv, capture_output=True, text=True, env=os.environ.copy()).returncode
    return time.perf_counter() - t, rc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    py = sys.executable
    from gpuready.doctor.probe import TorchProbe

    rows = []
    cases = {
        "doctor --fast --json": [py, "-m", "gpuready", "doctor", "--fast", "--json"],
        "doctor --json (with probe)": [py, "-m", "gpuready", "doctor", "--json"],
    }
    for name, argv in cases.items():
        times, rcs = zip(*(wall(argv) for _ in range(args.runs)), strict=True)
        rows.append((name, statistics.median(times), min(times), max(times), rcs[0]))
    probe_times = []
    for _ in range(args.runs):
        t = time.perf_counter()
        TorchProbe().result()
        probe_times.append(time.perf_counter() - t)
    rows.append(("torch probe alone (child)", statistics.median(probe_times), min(probe_times), max(probe_times), 0))
    imp = subprocess.run(
        [py, "-X", "importtime", "-m", "gpuready", "doctor", "--fast", "--json"],
        capture_output=True,
        text=True,
    )
    modules = [ln.split("|")[-1].strip() for ln in imp.stderr.splitlines() if ln.startswith("import time:")]
    torchy = sorted({m for m in modules if m.split(".")[0] in ("torch", "transformers")})
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"machine: {' '.join(platform.uname())}; nproc {os.cpu_count()}; cpu {cpu_model()}")
    print(f"python: {sys.version.split()[0]}; command: {' '.join(sys.argv)}\n")
    print("| case | median s | min s | max s | exit |")
    print("|---|---|---|---|---|")
    for name, med, lo, hi, rc in rows:
        print(f"| {name} | {med:.2f} | {lo:.2f} | {hi:.2f} | {rc} |")
    print(
        f"\n`python -X importtime -m gpuready doctor --fast --json`: {len(modules)} modules imported; "
        f"torch/transformers modules among them: {torchy or 'none'}"
    )


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


if __name__ == "__main__":
    main()
