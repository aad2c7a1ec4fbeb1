"""Accuracy of the arithmetic estimator against measured peaks (../shared/calibration/h200.jsonl and our own
rows in docs/calibration/). Prints a Markdown table per row and the summary the issue's targets are judged on.

    python benchmarks/accuracy.py [FILE.jsonl ...] [--markdown]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # runnable from a checkout without installing the package

from gpuready.errors import GpureadyError  # noqa: E402
from gpuready.memory import estimate  # noqa: E402
from gpuready.workload import workload_from_args  # noqa: E402

DEFAULT_FILES = [
    ROOT.parent / "shared" / "calibration" / "h200.jsonl",
    *sorted((ROOT / "docs" / "calibration").glob("*.jsonl")),
]
GIB = 2**30


def rows(files: list[Path]) -> list[dict[str, object]]:
    out = []
    for f in files:
        if not f.is_file():
            continue
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                row["_file"] = f.name
                out.append(row)
    return out


def pct(pred: float, meas: float) -> float:
    return (pred - meas) / meas * 100


def main(argv: list[str]) -> int:
    import platform

    files = [Path(a).resolve() for a in argv if not a.startswith("--")] or DEFAULT_FILES
    used = ", ".join(str(f.relative_to(ROOT.parent)) for f in files if f.is_file())
    print("# Accuracy of the arithmetic estimator\n")
    print(f"Date: {time.strftime('%Y-%m-%d')}. Machine: {platform.platform()}, Python {platform.python_version()}.")
    print(f"Command: `python benchmarks/accuracy.py {' '.join(argv)}`. Measured rows: {used}.")
    print("Error = predicted / measured - 1.\n")
    table = [
        "| file | id | measured reserved GiB | predicted GiB | error % | measured alloc GiB | predicted | error % |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    errs_r: list[float] = []
    errs_a: list[float] = []
    single_r: list[float] = []
    per_file: dict[str, list[float]] = {}
    skipped = []
    t0 = time.perf_counter()
    for row in rows(files):
        if not row.get("peak_reserved_bytes"):
            skipped.append(f"{row['id']} (no measurement: {row.get('error', 'failed')})")
            continue
        try:
            w = workload_from_args(str(row["args"]))
            est = estimate(w)
        except GpureadyError as exc:  # a bad row, or a job the estimator refuses (--kbit-prep)
            skipped.append(f"{row['id']} ({exc})")
            continue
        mr, ma = float(row["peak_reserved_bytes"]), float(row["peak_allocated_bytes"])  # type: ignore[arg-type]
        er, ea = pct(est.peak_reserved_bytes, mr), pct(est.peak_allocated_bytes, ma)
        errs_r.append(er)
        errs_a.append(ea)
        per_file.setdefault(str(row["_file"]), []).append(er)
        if w.gpus == 1:
            single_r.append(er)
        table.append(
            f"| {row['_file']} | {row['id']} | {mr / GIB:.2f} | {est.peak_reserved_bytes / GIB:.2f} | {er:+.1f} "
            f"| {ma / GIB:.2f} | {est.peak_allocated_bytes / GIB:.2f} | {ea:+.1f} |"
        )
    elapsed = time.perf_counter() - t0
    print("\n".join(table))
    for s in skipped:
        print(f"\nskipped: {s}", end="")
    print("\n")

    def summary(name: str, errs: list[float]) -> str:
        if not errs:
            return f"{name}: no rows"
        absd = sorted(abs(e) for e in errs)
        p90 = absd[min(len(absd) - 1, round(0.9 * (len(absd) - 1)))]
        return (
            f"{name}: n={len(errs)} median |err| {statistics.median(absd):.1f}%  p90 |err| {p90:.1f}%  "
            f"worst under {min(errs):+.1f}%  worst over {max(errs):+.1f}%"
        )

    if len(per_file) > 1:
        for name, errs in per_file.items():
            print(summary(f"peak reserved, {name}", errs))
    print(summary("peak reserved, single-GPU rows", single_r))
    print(summary("peak reserved, all rows", errs_r))
    print(summary("peak allocated", errs_a))
    print(f"({elapsed:.2f} s for {len(errs_r)} estimates)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
