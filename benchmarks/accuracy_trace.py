"""Accuracy of the traced mode against measured peaks (../shared/calibration/h200.jsonl by default).

Usage: PYTHONPATH=src python benchmarks/accuracy_trace.py [CALIBRATION.jsonl] [--only ID_SUBSTRING]
Prints one row per job (error of peak reserved and peak allocated, seconds to trace) and the summary:
median |error|, 90th percentile |error|, worst underestimate. Rows the traced mode cannot run are listed
as skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from gpuready.errors import GpureadyError
from gpuready.memory.trace import trace_estimate
from gpuready.workload import workload_from_args

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO.parent / "shared" / "calibration" / "h200.jsonl"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("calibration", nargs="?", default=str(DEFAULT))
    parser.add_argument("--only", default="")
    opts = parser.parse_args()
    rows = [json.loads(line) for line in Path(opts.calibration).read_text().splitlines() if line.strip()]
    err_res: list[float] = []
    err_all: list[float] = []
    print("| job | measured reserved GiB | traced reserved GiB | error reserved | error allocated | phase | s |")
    print("|---|---:|---:|---:|---:|---|---:|")
    skipped: list[str] = []
    for row in rows:
        if opts.only not in row["id"]:
            continue
        w = workload_from_args(row["args"])
        start = time.perf_counter()
        try:
            est = trace_estimate(w)
        except GpureadyError as exc:
            skipped.append(f"{row['id']}: {exc}")
            continue
        except Exception as exc:  # a tracing failure is a result to report, not a crash of the benchmark
            skipped.append(f"{row['id']}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        seconds = time.perf_counter() - start
        er = est.peak_reserved_bytes / row["peak_reserved_bytes"] - 1
        ea = est.peak_allocated_bytes / row["peak_allocated_bytes"] - 1
        err_res.append(er)
        err_all.append(ea)
        print(
            f"| {row['id']} | {row['peak_reserved_bytes'] / 2**30:.2f} "
            f"| {est.peak_reserved_bytes / 2**30:.2f} "
            f"| {er:+.1%} | {ea:+.1%} | {est.phase} | {seconds:.1f} |",
            flush=True,
        )
    for line in skipped:
        print(f"skipped: {line}")
    if err_res:
        for name, errs in (("peak_reserved_bytes", err_res), ("peak_allocated_bytes", err_all)):
            absolute = [abs(e) for e in errs]
            print(
                f"{name}: n={len(errs)} median |error| {statistics.median(absolute):.1%}, "
                f"p90 {percentile(absolute, 0.9):.1%}, worst underestimate {min(min(errs), 0):+.1%}, "
                f"worst overestimate {max(max(errs), 0):+.1%}"
            )


if __name__ == "__main__":
    main()
