"""Runs (and wall time) of gpuready's find-max against doubling-from-1-then-bisect.

Two modes:
  simulated  cases whose memory follows a formula (no GPU): counts runs only.
  probe      a real job on this GPU: every distinct value is measured once with the built-in probe (a fresh
             process per point) and shared between the strategies; each strategy is charged the runs it asked
             for and the measured wall seconds of those runs, as if it had run alone. Also writes the
             sweep's and the find-max's `gpuready trial --json` documents and charts.

    python benchmarks/find_max.py simulated
    python benchmarks/find_max.py probe llama-3.2-1b --seq 2048 --sweep 1,2,4,8,16 --out DIR [--method lora]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpuready.trial.api import estimator_predictor, run_backend
from gpuready.trial.chart import text_chart, write_chart
from gpuready.trial.result import Point
from gpuready.trial.search import doubling_then_bisect, find_max
from gpuready.trial.simulate import SimulatedDevice
from gpuready.units import GIB
from gpuready.workload import make_workload

# name, fixed GiB, per-unit GiB, capacity GiB, quadratic GiB, variable, granularity
CASES: list[tuple[str, float, float, float, float, str, int]] = [
    ("1B full FT, batch, H200-like", 8.2, 6.3, 139.6, 0.0, "batch", 1),
    ("8B LoRA, batch, H200-like", 17.0, 21.0, 139.6, 0.0, "batch", 1),
    ("0.5B, batch, 80 GB", 3.0, 0.55, 79.0, 0.0, "batch", 1),
    ("ResNet-50, batch, 24 GB", 0.9, 0.083, 23.0, 0.0, "batch", 1),
    ("7B infer, seq (eager, quadratic), 80 GB", 14.0, 0.0006, 79.0, 2.0e-8, "seq", 256),
    ("1B full FT, seq, 48 GB", 8.2, 0.0031, 47.0, 0.0, "seq", 256),
]
ERRORS = [None, -0.15, 0.0, 0.15]  # estimator's relative error on the per-unit part (None: no estimator)


def simulated() -> list[dict[str, Any]]:
    rows = []
    for name, fixed, slope, cap, quad, var, g in CASES:
        base = SimulatedDevice(var, fixed * GIB, slope * GIB, cap * GIB, quad * GIB)
        truth = base.true_max(granularity=g)
        dev = SimulatedDevice(var, fixed * GIB, slope * GIB, cap * GIB, quad * GIB)
        baseline = doubling_then_bisect(dev, var, granularity=g)
        for err in ERRORS:
            dev = SimulatedDevice(var, fixed * GIB, slope * GIB, cap * GIB, quad * GIB)
            predict = None if err is None else dev.estimator(slope_error=err)
            found = find_max(dev, var, capacity_bytes=cap * GIB, predict=predict, granularity=g)
            rows.append(
                {
                    "case": name,
                    "estimator_error": "none" if err is None else f"{err:+.0%}",
                    "true_max": truth,
                    "find_max": found.max,
                    "find_max_runs": found.runs,
                    "baseline_max": baseline.max,
                    "baseline_runs": baseline.runs,
                    "ratio": found.runs / baseline.runs,
                }
            )
    return rows


class _Memo:
    """Measures each value once on the real backend; strategies see the stored point."""

    def __init__(self, backend: Any, log: Any) -> None:
        self.backend, self.log = backend, log
        self.points: dict[tuple[tuple[str, int], ...], Point] = {}

    def run_point(self, values: dict[str, int]) -> Point:
        key = tuple(sorted(values.items()))
        if key not in self.points:
            point = self.backend.run_point(values)
            self.points[key] = point
            self.log(f"measured {values}: {point.status} {point.peak_device_bytes} B in {point.wall_seconds:.1f} s")
        return self.points[key]


def probe(opts: argparse.Namespace) -> list[dict[str, Any]]:
    from gpuready.trial.backend import ProbeBackend

    fields = {"model": opts.model, "seq": opts.seq, "method": opts.method, "batch": 1}
    if opts.grad_ckpt:
        fields["grad_ckpt"] = True
    workload = make_workload(**fields)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    memo = _Memo(ProbeBackend(workload), lambda s: sys.stderr.write(s + "\n"))
    predict = estimator_predictor(workload, "batch")
    tag = opts.tag
    sweep_values = [int(v) for v in opts.sweep.split(",")]
    sweep = run_backend(
        memo,
        kind="probe",
        target=opts.model,
        variable="batch",
        values=sweep_values,
        predict=predict,
        workload=workload.model_dump(mode="json"),
    )
    (out / f"{tag}_sweep.json").write_text(json.dumps(sweep.to_json(), indent=2))
    write_chart(sweep, out / f"{tag}_sweep.png", predict, f"{tag}: peak memory vs batch")
    found = run_backend(
        memo,
        kind="probe",
        target=opts.model,
        variable="batch",
        find_max=True,
        predict=predict,
        capacity_bytes=sweep.capacity_bytes,
        workload=workload.model_dump(mode="json"),
    )
    (out / f"{tag}_find_max.json").write_text(json.dumps(found.to_json(), indent=2))
    write_chart(found, out / f"{tag}_find_max.png", predict, f"{tag}: find-max batch = {found.max}")
    baseline = doubling_then_bisect(memo, "batch") if opts.baseline else None
    for line in text_chart(sweep, predict):
        sys.stderr.write(line + "\n")

    def wall(points: list[Point]) -> float:
        return sum(p.wall_seconds or 0.0 for p in points)

    return [
        {
            "job": tag,
            "strategy": "find-max" + (" (estimator start)" if predict else " (no estimator: from 1)"),
            "max": found.max,
            "runs": len(found.points),
            "wall_seconds": wall(found.points),
            "values": [p.values["batch"] for p in found.points],
        },
        *(
            [
                {
                    "job": tag,
                    "strategy": "doubling-then-bisect",
                    "max": baseline.max,
                    "runs": baseline.runs,
                    "wall_seconds": wall(baseline.points),
                    "values": [p.values["batch"] for p in baseline.points],
                }
            ]
            if baseline
            else []
        ),
        {
            "job": tag,
            "strategy": "distinct points measured on the GPU",
            "max": None,
            "runs": len(memo.points),
            "wall_seconds": wall(list(memo.points.values())),
            "values": sorted(k[0][1] for k in memo.points),
        },
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("simulated", "probe"))
    ap.add_argument("model", nargs="?")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--method", default="full")
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--sweep", default="1,2,4,8")
    ap.add_argument("--out", default=".")
    ap.add_argument("--tag", default="job")
    ap.add_argument("--baseline", action="store_true", help="also run doubling-then-bisect (probe mode)")
    opts = ap.parse_args()
    rows = simulated() if opts.mode == "simulated" else probe(opts)
    for row in rows:
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
