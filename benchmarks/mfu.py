"""Achieved share of peak (MFU) of the measured H200 training rows, by plan.step_flops (the FLOPs of the
job's ops, plan/ops/). The step-time model itself is checked by benchmarks/steptime.py.
    python benchmarks/mfu.py"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from gpuready.models import resolve_model
from gpuready.plan import step_flops
from gpuready.workload import workload_from_args

ROOT = Path(__file__).resolve().parent.parent
FILES = [
    ROOT.parent / "shared" / "calibration" / "h200.jsonl",
    *sorted((ROOT / "docs" / "calibration").glob("*.jsonl")),
]
PEAK = {"half": 989e12, "fp32": 67e12}  # H200 SXM dense bf16 and fp32 (catalog/data/gpus.csv)


def main() -> int:
    shares: dict[str, list[float]] = {"half": [], "fp32": []}
    print("| row | step s | TFLOP/s | share of peak |\n|---|---:|---:|---:|")
    for f in FILES:
        if not f.is_file():
            continue
        for line in f.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            w = workload_from_args(row["args"])
            flops = step_flops(resolve_model(w.model), w) if row.get("step_seconds") and w.gpus == 1 else None
            if flops is None:
                continue
            kind = "fp32" if w.precision == "fp32" else "half"
            achieved = flops / row["step_seconds"]
            shares[kind].append(achieved / PEAK[kind])
            print(f"| {row['id']} | {row['step_seconds']:.3f} | {achieved / 1e12:.0f} | {achieved / PEAK[kind]:.2f} |")
    for kind, vals in shares.items():
        print(f"\n{kind}: n={len(vals)} median {statistics.median(vals):.2f} (range {min(vals):.2f}-{max(vals):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
