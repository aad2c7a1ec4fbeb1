"""Compare the traced mode's allocations for a job with the GPU's recorded allocator history of the same job.

Usage: PYTHONPATH=src python benchmarks/trace_vs_history.py HISTORY.json.gz "MODEL --flag value ..." [--diffs N]
       [--from-phase forward]

The history is what `GPUREADY_PROBE_MEMORY_HISTORY=FILE gpuready trial ...` recorded on the GPU
(docs/calibration/histories). The job is traced as `gpuready estimate --trace` traces it (memory/trace.py), and
the two request sequences (sizes, in order) are aligned: the output lists the first places where they differ,
with the GPU's Python frames on one side and the trace's component labels on the other, then both peaks
(the history replayed through the same allocator model, and the trace's replay).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


from gpuready.memory.history import load_history, replay_history
from gpuready.memory.trace import _extrapolate_decode, _replay
from gpuready.memory.trace_run import run_trace
from gpuready.workload import workload_from_args

GIB = 1024**3


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("history", type=Path)
    ap.add_argument("job", help="the job as gpuready estimate arguments, quoted")
    ap.add_argument("--diffs", type=int, default=15, help="how many differing stretches to show")
    ap.add_argument("--context", type=int, default=2)
    ap.add_argument("--start", type=int, default=0, help="show differences from this GPU allocation on")
    ap.add_argument("--limit", type=int, default=0, help="align the first N allocations of each only")
    args = ap.parse_args()
    doc = load_history(args.history)
    frames = doc["frames"]
    gpu = [(size, frames[fid]) for action, _a, size, _s, fid in doc["events"] if action == "alloc"]
    w = workload_from_args(args.job)
    job = run_trace(w)
    trace = job.trace
    if not w.training and w.new_tokens > 1:
        _extrapolate_decode(trace, w.new_tokens - 1)
    marks = sorted(trace.marks)
    ours: list[tuple[int, str]] = []
    mi, phase = 0, "load"
    aid = 0
    for i, ev in enumerate(trace.events):
        while mi < len(marks) and marks[mi][0] <= i:
            phase = marks[mi][1]
            mi += 1
        if ev > 0:
            aid += 1
            ours.append((ev, f"{phase}/{trace.labels[aid]}"))
    a = [s for s, _ in gpu]
    b = [s for s, _ in ours]
    if args.limit:
        a, b = a[: args.limit], b[: args.limit]
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    shown = 0
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal" or i2 < args.start:
            continue
        print(f"--- {tag}: GPU [{i1}:{i2}] vs trace [{j1}:{j2}]")
        for k in range(max(0, i1 - args.context), min(i2, i1 + 12)):
            mark = " " if k < i1 else "-"
            print(f"  GPU {mark} {a[k]:>12d}  {gpu[k][1][:150]}")
        for k in range(max(0, j1 - args.context), min(j2, j1 + 12)):
            mark = " " if k < j1 else "+"
            print(f"  TR  {mark} {b[k]:>12d}  {ours[k][1]}")
        shown += 1
        if shown >= args.diffs:
            break
    hist = replay_history(doc)
    rep = _replay(trace)
    print(
        f"GPU history: {len(a)} allocations, peak reserved {hist.gpu_peak_reserved_bytes / GIB:.3f} GiB "
        f"(replayed {hist.model_peak_reserved_bytes / GIB:.3f}), allocated {hist.gpu_peak_allocated_bytes / GIB:.3f}"
    )
    print(
        f"trace: {len(b)} allocations, peak reserved {rep.peak_reserved / GIB:.3f} GiB, "
        f"allocated {rep.peak_allocated / GIB:.3f}; matching blocks {sum(n for *_, n in sm.get_matching_blocks())}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
