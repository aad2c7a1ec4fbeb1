"""The estimator's program under a cap against the GPU's recorded requests under the same cap.

For each recorded allocator history (docs/calibration/histories, one GPU) whose job is listed in
benchmarks/histories/*.txt, the smallest allocator limit under which the job completes, found by bisection (to 16 MiB):

- replaying the GPU's own requests through the allocator model (memory/allocator.py, which reproduces the GPU's
  reserve on these requests with no limit: benchmarks/allocator_check.py);
- replaying the estimator's program of the same job (memory/estimate.py), as the fit rule does (memory/fit.py).

Where the program completes under a smaller limit than the real requests, the fit rule would promise a card on which
the job fails: the shortfall, as a share of that limit, is what a margin must cover. The bisection assumes that a
job that completes under a limit completes under every larger one, which is nearly but not always true near the
limit (memory/fit.py).

    python benchmarks/capped_check.py [--markdown] [NAME ...]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuready.memory.allocator import replay  # noqa: E402
from gpuready.memory.history import load_history  # noqa: E402

GIB = 1024**3
TOL = 16 * 1024**2
HISTORIES = ROOT / "docs" / "calibration" / "histories"


def jobs() -> dict[str, str]:
    """history name -> `gpuready trial` arguments, from the lists that recorded them."""
    out: dict[str, str] = {}
    for path in sorted((ROOT / "benchmarks" / "histories").glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                name, args = line.split(None, 1)
                out[name] = args
    return out


def request_events(doc: dict[str, object]) -> list[int] | None:
    """The history's allocations and frees in replay's encoding; None when they use more than one CUDA stream."""
    ids: dict[int, int] = {}
    out: list[int] = []
    streams = set()
    n = 0
    for action, addr, size, stream, _fid in doc["events"]:  # type: ignore[attr-defined]
        if action == "alloc":
            n += 1
            ids[addr] = n
            out.append(size)
            streams.add(stream)
        elif action == "free_completed" and addr in ids:
            out.append(-ids.pop(addr))
    return out if len(streams) <= 1 else None


def min_limit(events: Sequence[int]) -> tuple[int, int, int]:
    """(smallest limit it completes under, peak allocated, peak reserved with no limit)."""
    free = replay(events)
    lo, hi = free.peak_allocated_bytes, free.peak_reserved_bytes
    while hi - lo > TOL:
        mid = (lo + hi) // 2
        if replay(events, mid).oom_event is None:
            hi = mid
        else:
            lo = mid
    return hi, free.peak_allocated_bytes, free.peak_reserved_bytes


def program_events(args: str) -> list[int]:
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    est = importlib.import_module("gpuready.memory.estimate")
    w = workload_from_args(args)
    prog = est._build(resolve_model(w.model, w.as_family), w)
    return list(prog.events) if not prog.streams else []


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="history names (default: every single-GPU one with a listed job)")
    opts = ap.parse_args()
    listed = jobs()
    names = opts.names or sorted(
        p.name.removesuffix(".json.gz") for p in HISTORIES.glob("*.json.gz") if not p.name.endswith(".result.json.gz")
    )
    print("| history | job | GPU requests: limit GiB | program: limit GiB | program short by |")
    print("|---|---|---:|---:|---:|")
    for name in names:
        if name not in listed:
            continue
        doc = load_history(HISTORIES / f"{name}.json.gz")
        real = request_events(doc)
        prog = program_events(listed[name])
        if real is None or not prog:
            continue
        (g, _, _), (p, _, _) = min_limit(real), min_limit(prog)
        print(f"| {name} | `{listed[name]}` | {g / GIB:.2f} | {p / GIB:.2f} | {(g - p) / g * 100:+.1f}% |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
