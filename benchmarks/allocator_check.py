"""Check the caching-allocator model against PyTorch's own on real jobs.

On a GPU machine, record a job's allocator history with the probe:

    GPUREADY_PROBE_MEMORY_HISTORY=/tmp/h.json gpuready trial MODEL ... --no-db --json

(under `--nproc N` each rank writes /tmp/h.json.rank<r>). Then, anywhere:

    python benchmarks/allocator_check.py /tmp/h.json [...]          # one report per history
    python benchmarks/allocator_check.py --table docs/calibration/histories/*.gz

replays the real sequence of allocations and frees (per CUDA stream, as the allocator keeps its pools) through
gpuready.memory.allocator (gpuready/memory/history.py) and compares peak reserved as the GPU reported it with what
the model gets from the very same requests; the first segment the model creates differently (with the Python
frames that asked for it); and what was live at the peak, grouped by frame. `--table` does it for three segment
placements: the model's, the GPU's own addresses, and always-rising addresses.

A history recorded under a cap (`gpuready trial ... --gpu-memory CARD`; the probe writes the cap into the history)
is also replayed under that cap (`--cap SIZE` replays any history under SIZE instead): does the allocator model,
given the GPU's very requests, fail where the GPU failed? If it does, a difference between the estimator and the GPU
under a cap lies in the program's events; if not, in the allocator model under a cap.

    python benchmarks/allocator_check.py HISTORY --job "qwen2.5-3b --task train --batch 2 ... --shard fsdp"

compares the estimator's arithmetic program for that job with the history, stream by stream (the compute stream,
then the side streams in the order they are first used: FSDP2's all-gather, then reduce-scatter), both through
the allocator model, so that any difference in reserve is the program's events: the reserve and the segments each
makes (size x count), and the first large-pool segment that differs with the events leading to it on both sides.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpuready.memory.history import PLACEMENTS, compare_program, load_history, replay_capped, replay_history

GIB = 1024**3
MIB = 1024**2


def report(path: Path, placement: str) -> None:
    res = replay_history(load_history(path), placement)
    print(f"## {path.name}")
    print(
        f"reserved: GPU {res.gpu_peak_reserved_bytes / GIB:.2f} GiB, model on the same requests "
        f"{res.model_peak_reserved_bytes / GIB:.2f} GiB ({res.error * 100:+.2f}%); segments GPU {res.gpu_segments}, "
        f"model {res.model_segments}; allocated GPU {res.gpu_peak_allocated_bytes / GIB:.2f}, from the history "
        f"{res.trace_peak_allocated_bytes / GIB:.2f} GiB"
    )
    if res.first_difference:
        print(f"first different segment: {res.first_difference}")
    print("live at the peak, by frame:")
    for frame, size in res.live_at_peak:
        print(f"  {size / GIB:8.3f} GiB  {frame[:160]}")


def capped(path: Path, cap: int | None, placement: str) -> None:
    doc = load_history(path)
    if cap is None and not doc.get("memory_cap_bytes"):
        return
    r = replay_capped(doc, cap, placement)
    gpu = (
        f"failed at event {r.gpu_oom_event} on {r.gpu_oom_bytes / GIB:.2f} GiB"
        if r.gpu_oom_event is not None
        else "ran"
    )
    print(f"## {path.name} under a cap of {r.cap_bytes / GIB:.2f} GiB")
    print(
        f"GPU: {gpu}, allocated {r.gpu_allocated_bytes / GIB:.2f} GiB, reserved {r.gpu_reserved_bytes / GIB:.2f} GiB, "
        f"{r.gpu_releases} segments released"
    )
    if r.model_failed_at is not None:
        model = f"failed earlier, at event {r.model_failed_at} (the GPU served it)"
    elif r.model_fails_there is None:
        model = "ran"
    else:
        model = "fails there too" if r.model_fails_there else "places it (the GPU could not)"
    print(
        f"model on the same requests: {model}; allocated {r.model_allocated_bytes / GIB:.2f} GiB, reserved "
        f"{r.model_reserved_bytes / GIB:.2f} GiB, cached free {r.model_free_split_bytes / GIB:.2f} GiB in split "
        f"segments and {r.model_free_whole_bytes / GIB:.2f} GiB in whole ones (largest block "
        f"{r.model_largest_free_bytes / GIB:.2f} GiB), {r.model_releases} releases"
    )
    if r.gpu_frames:
        print(f"request: {r.gpu_frames[:200]}")


def table(paths: list[Path]) -> None:
    print("| history | events | GPU peak reserved GiB | " + " | ".join(f"{p} placement" for p in PLACEMENTS) + " |")
    print("|---|---:|---:|" + "---:|" * len(PLACEMENTS))
    for path in paths:
        doc = load_history(path)
        if "events" not in doc:
            continue  # a probe's result beside the histories (*.result.json.gz), not a history
        if doc.get("memory_cap_bytes"):
            continue  # recorded under a cap: replayed under it above (its released segments' addresses recur)
        runs = [replay_history(doc, p) for p in PLACEMENTS]
        cells = " | ".join(f"{r.error * 100:+.2f}%" for r in runs)
        print(f"| {path.name} | {runs[0].events} | {runs[0].gpu_peak_reserved_bytes / GIB:.2f} | {cells} |")


def compare(path: Path, job: str, context: int, depth: int) -> None:
    import importlib

    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    est = importlib.import_module("gpuready.memory.estimate")  # the module (the package exports the function)
    w = workload_from_args(job)
    spec = resolve_model(w.model, w.as_family)
    prog = est._build(spec, w, est.fsdp_meta_init(spec, w, None))
    print(f"## {path.name} against the program of `{job}`")
    for c in compare_program(load_history(path), prog, context, depth):
        err = c.program_reserved_bytes / c.history_reserved_bytes - 1 if c.history_reserved_bytes else 0.0
        print(
            f"stream {c.stream} (history {c.history_stream}): reserved history {c.history_reserved_bytes / MIB:.0f} "
            f"MiB, program {c.program_reserved_bytes / MIB:.0f} MiB ({err * 100:+.2f}%)"
        )
        sizes = sorted(set(c.history_segments) | set(c.program_segments), reverse=True)
        print(
            "  segments MiB x (history, program): "
            + ", ".join(
                f"{s / MIB:.0f} x ({c.history_segments.get(s, 0)}, {c.program_segments.get(s, 0)})"
                for s in sizes
                if c.history_segments.get(s, 0) != c.program_segments.get(s, 0) or s > 64 * MIB
            )
        )
        if c.first_difference is None:
            print("  the large-pool segments are made in the same sizes and order")
            continue
        a, b = c.first_difference
        print(
            f"  first different large segment: history {a.segment_bytes / MIB:.0f} MiB for {a.request_bytes / MIB:.1f}"
            f" ({a.label}), program {b.segment_bytes / MIB:.0f} MiB for {b.request_bytes / MIB:.1f} ({b.label})"
        )
        for name, events in (("history", c.history_context), ("program", c.program_context)):
            print(f"  {name}, the events before it:")
            for ev in events:
                print(f"    {'+' if ev.alloc else '-'}{ev.nbytes / MIB:9.2f} MiB  {ev.label[:100]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("histories", nargs="+", type=Path)
    ap.add_argument("--placement", choices=PLACEMENTS, default="model")
    ap.add_argument("--table", action="store_true", help="one line per history, every placement")
    ap.add_argument("--cap", type=int, help="replay under this many bytes (default: a capped history's own cap)")
    ap.add_argument("--job", help="compare the estimator's program for this job (workload arguments) per stream")
    ap.add_argument("--context", type=int, default=24, help="with --job: events shown before the first difference")
    ap.add_argument("--depth", type=int, default=1, help="with --job: Python frames per history label")
    args = ap.parse_args()
    if args.job:
        for path in args.histories:
            compare(path, args.job, args.context, args.depth)
        return 0
    for path in args.histories:
        capped(path, args.cap, args.placement)
    if args.table:
        table(args.histories)
    else:
        for path in args.histories:
            report(path, args.placement)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
