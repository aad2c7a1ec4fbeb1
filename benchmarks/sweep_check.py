"""A predicted sweep against a measured one: `gpuready estimate ... --sweep VAR=... --json` (committed before the GPU
ran) beside `gpuready trial ... --sweep VAR=... --json` of the same job, value by value.

python benchmarks/sweep_check.py PREDICTED.json MEASURED.json   # a Markdown table: peaks and errors per value

Errors are (predicted - measured) / measured on peak reserved and peak allocated, as docs/accuracy.md reports them.
Exit 1 when the two files do not sweep the same variable over the same values.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

GIB = 1 << 30


def rows(predicted: dict[str, Any], measured: dict[str, Any]) -> list[dict[str, Any]]:
    if predicted["variable"] != measured["variable"]:
        raise ValueError(f"variables differ: {predicted['variable']} and {measured['variable']}")
    var = predicted["variable"]
    taken = {p["values"][var]: p for p in measured["points"]}
    out = []
    for p in predicted["points"]:
        value = p["values"][var] if "values" in p else p["value"]  # (`value` until 2026-12-01's first sweep check)
        m = taken.get(value)
        if m is None:
            raise ValueError(f"{var}={value} was not measured")
        row: dict[str, Any] = {"value": value, "status": m["status"]}
        for key in ("peak_reserved_bytes", "peak_allocated_bytes"):
            got = m.get(key)
            row[key] = (p[key], got, (p[key] - got) / got if got else None)
        out.append(row)
    return out


def table(predicted: dict[str, Any], measured: dict[str, Any]) -> str:
    var = predicted["variable"]
    lines = [
        f"| {var} | measured | reserved: predicted / measured GiB | error | allocated: predicted / measured GiB "
        "| error |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows(predicted, measured):
        cells = [str(r["value"]), r["status"]]
        for key in ("peak_reserved_bytes", "peak_allocated_bytes"):
            pred, got, err = r[key]
            cells.append(f"{pred / GIB:.2f} / {got / GIB:.2f}" if got else f"{pred / GIB:.2f} / -")
            cells.append(f"{err:+.1%}" if err is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("predicted", type=Path)
    ap.add_argument("measured", type=Path)
    args = ap.parse_args()
    try:
        print(table(json.loads(args.predicted.read_text()), json.loads(args.measured.read_text())))
    except ValueError as exc:
        print(f"sweep_check: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
