"""Recorded allocator histories: replay what PyTorch's caching allocator really saw through gpuready's model.

A history is what `GPUREADY_PROBE_MEMORY_HISTORY=FILE gpuready trial ...` writes (the probe records
torch.cuda.memory._record_memory_history and keeps, per event: action, address, size, stream and the innermost
Python frames). Replaying its allocations and frees through memory/allocator.py per CUDA stream tells whether the
allocator model reproduces the GPU's reserve on the very same requests, where it first creates a different
segment, and what was live at the peak. Files may be gzip-compressed (.gz).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuready.memory.allocator import ROUND_LARGE, SMALL_BUFFER, Block, CachingAllocator
from gpuready.memory.program import Program

PLACEMENTS = ("model", "gpu", "rising")


def load_history(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc: dict[str, Any] = json.loads(raw)
    return doc


class _Placed(CachingAllocator):
    """The allocator model with its segments placed elsewhere: "model" as gpuready places them, "gpu" at the
    addresses the GPU's driver gave (from the history), "rising" every new segment above the last (gpuready before
    2026-11-30). Addresses only break ties between equal-sized cached blocks."""

    def __init__(self, placement: str, addresses: list[int]) -> None:
        super().__init__()
        self.placement = placement
        self.addresses = addresses
        self._top = 1 << 50

    def _place(self, seg: int, small: bool) -> int:
        if self.placement == "gpu":
            return self.addresses.pop(0)
        if self.placement == "rising":
            addr, self._top = self._top, self._top + seg + ROUND_LARGE
            return addr
        return super()._place(seg, small)


@dataclass(frozen=True)
class SegmentDifference:
    index: int  # the n-th segment created
    gpu_bytes: int
    gpu_frames: str
    model_bytes: int
    model_frames: str


@dataclass(frozen=True)
class Replay:
    placement: str
    events: int
    gpu_peak_reserved_bytes: int  # as the probe read max_memory_reserved
    model_peak_reserved_bytes: int  # the model on the same requests, counted from the same reset
    gpu_peak_allocated_bytes: int
    trace_peak_allocated_bytes: int  # from the history's requested sizes
    gpu_segments: int
    model_segments: int
    first_difference: SegmentDifference | None
    live_at_peak: list[tuple[str, int]] = field(default_factory=list)  # (frames, bytes), largest first

    @property
    def error(self) -> float:
        return self.model_peak_reserved_bytes / self.gpu_peak_reserved_bytes - 1


def replay_history(doc: dict[str, Any], placement: str = "model", top: int = 12) -> Replay:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}")
    events: list[list[Any]] = doc["events"]
    frames: list[str] = doc["frames"]
    reset_at = int(doc.get("reset_at") or 0)
    addresses: dict[int, list[int]] = defaultdict(list)
    for action, addr, _size, stream, _fid in events:
        if action == "segment_alloc":
            addresses[stream].append(addr)
    pools: dict[int, CachingAllocator] = {}
    blocks: dict[int, tuple[int, Block]] = {}
    live: dict[int, tuple[int, int]] = {}  # addr -> (size, frame id)
    capped = bool(doc.get("memory_cap_bytes"))
    gpu_segments: list[tuple[int, int]] = []
    model_segments: list[tuple[int, int]] = []
    allocated = peak_alloc = 0
    peak_live: dict[int, tuple[int, int]] = {}
    model_peak = 0
    for i, (action, addr, size, stream, fid) in enumerate(events):
        if i == reset_at:
            peak_alloc, peak_live = allocated, dict(live)
            model_peak = sum(p.reserved for p in pools.values())
        if action == "alloc":
            pool = pools.get(stream)
            if pool is None:
                pool = pools[stream] = _Placed(placement, addresses[stream])
            before = pool.reserved
            blocks[addr] = (stream, pool.malloc(size))
            if pool.reserved > before:
                model_segments.append((pool.reserved - before, fid))
            live[addr] = (size, fid)
            allocated += size
            if i >= reset_at:
                if allocated > peak_alloc:
                    peak_alloc, peak_live = allocated, dict(live)
                model_peak = max(model_peak, sum(p.reserved for p in pools.values()))
        elif action == "free_completed":
            if addr in blocks:
                owner, block = blocks.pop(addr)
                pools[owner].free(block)
            if addr in live:
                allocated -= live.pop(addr)[0]
        elif action == "segment_alloc":
            gpu_segments.append((size, fid))
        elif action == "segment_free" and not capped and (i == 0 or events[i - 1][0] != "segment_free"):
            # with no limit nothing forces a release: a run of segment frees is torch.cuda.empty_cache() (peft's
            # prepare_model_for_kbit_training calls it after its fp32 casts: histories kbit_prep_*)
            for pool in pools.values():
                pool.release_cached()
    first = None
    for k, (gpu, model) in enumerate(zip(gpu_segments, model_segments, strict=False)):
        if gpu[0] != model[0]:
            first = SegmentDifference(k, gpu[0], frames[gpu[1]], model[0], frames[model[1]])
            break
    by_frame: dict[str, int] = defaultdict(int)
    for size, fid in peak_live.values():
        by_frame[frames[fid]] += size
    return Replay(
        placement=placement,
        events=len(events),
        gpu_peak_reserved_bytes=int(doc.get("peak_reserved_bytes") or 0),
        model_peak_reserved_bytes=model_peak,
        gpu_peak_allocated_bytes=int(doc.get("peak_allocated_bytes") or 0),
        trace_peak_allocated_bytes=peak_alloc,
        gpu_segments=len(gpu_segments),
        model_segments=len(model_segments),
        first_difference=first,
        live_at_peak=sorted(by_frame.items(), key=lambda kv: -kv[1])[:top],
    )


@dataclass(frozen=True)
class CappedReplay:
    """A history recorded under `gpuready trial --gpu-memory` (the allocator capped by
    set_per_process_memory_fraction) against the allocator model replaying the same requests under the same cap.

    The GPU's side is read from the history: where it failed (its `oom` event) and its reserve and cached free bytes
    then; the model's side: whether it fails on a request the GPU served (`model_failed_at`, too strict), and at the
    GPU's failing request whether it fails too (`model_fails_there`; False: the model places a block the GPU could
    not, too lenient), with its state there."""

    cap_bytes: int
    events: int
    gpu_oom_event: int | None  # index into the history's events of the GPU's failed request, None if it ran
    gpu_oom_bytes: int
    gpu_releases: int  # segments the GPU gave back to the device (segment_free) to go on
    gpu_allocated_bytes: int  # at the GPU's failure (or at the end)
    gpu_reserved_bytes: int
    model_failed_at: int | None  # a request the GPU served and the model could not
    model_fails_there: bool | None  # at the GPU's failed request (None: the GPU did not fail or the model failed first)
    model_releases: int
    model_allocated_bytes: int  # the model's state at the GPU's failure (or where the model failed, or at the end)
    model_reserved_bytes: int
    model_free_split_bytes: int  # cached free bytes in segments that are split (not releasable)
    model_free_whole_bytes: int  # cached free bytes in wholly free segments
    model_largest_free_bytes: int
    gpu_frames: str  # the Python frames of the GPU's failed request (or of the model's)


def _free_state(alloc: CachingAllocator) -> tuple[int, int, int]:
    split = whole = largest = 0
    for pool in alloc._pools.values():
        for b in pool.blocks.values():
            if b.prev is None and b.next is None:
                whole += b.size
            else:
                split += b.size
            largest = max(largest, b.size)
    return split, whole, largest


def replay_capped(doc: dict[str, Any], cap_bytes: int | None = None, placement: str = "model") -> CappedReplay:
    """Replay a history's requests under `cap_bytes` (the history's own `memory_cap_bytes` when None), one
    allocator per CUDA stream sharing the cap as PyTorch's per-device limit does, and compare with the GPU."""
    from gpuready.memory.allocator import AllocatorOutOfMemory

    cap = int(cap_bytes if cap_bytes is not None else doc.get("memory_cap_bytes") or 0)
    if cap <= 0:
        raise ValueError("the history was not recorded under a cap; give cap_bytes")
    events: list[list[Any]] = doc["events"]
    frames: list[str] = doc["frames"]
    addresses: list[int] = [addr for action, addr, _s, _st, _f in events if action == "segment_alloc"]
    # one allocator whose pools are kept per stream (CachingAllocator.malloc's stream argument), so that the cap
    # and release_cached cover every stream as on the GPU
    alloc = _Placed(placement, addresses)
    alloc.capacity_bytes = cap
    blocks: dict[int, Block] = {}
    live: dict[int, int] = {}
    gpu_reserved = gpu_releases = 0
    gpu_oom: int | None = None
    gpu_oom_bytes = 0
    model_failed: int | None = None
    fails_there: bool | None = None
    where = 0
    recorded_uncapped = not doc.get("memory_cap_bytes")
    for i, (action, addr, size, stream, fid) in enumerate(events):
        if action == "segment_alloc":
            gpu_reserved += size
        elif action == "segment_free":
            gpu_reserved -= size
            gpu_releases += 1
            if recorded_uncapped and (i == 0 or events[i - 1][0] != "segment_free"):
                alloc.release_cached()  # recorded with no limit: torch.cuda.empty_cache() (see replay_history)
        elif action == "oom":
            gpu_oom, gpu_oom_bytes, where = i, size, fid
            try:
                alloc.malloc(size, stream)
                fails_there = False
            except AllocatorOutOfMemory:
                fails_there = True
            break
        elif action == "alloc":
            try:
                blocks[addr] = alloc.malloc(size, stream)
            except AllocatorOutOfMemory:
                model_failed, where = i, fid
                break
            live[addr] = size
        elif action == "free_completed" and addr in blocks:
            alloc.free(blocks.pop(addr))
            live.pop(addr, None)
    split, whole, largest = _free_state(alloc)
    return CappedReplay(
        cap_bytes=cap,
        events=len(events),
        gpu_oom_event=gpu_oom,
        gpu_oom_bytes=gpu_oom_bytes,
        gpu_releases=gpu_releases,
        gpu_allocated_bytes=sum(live.values()),
        gpu_reserved_bytes=gpu_reserved,
        model_failed_at=model_failed,
        model_fails_there=fails_there,
        model_releases=alloc.releases,
        model_allocated_bytes=alloc.allocated,
        model_reserved_bytes=alloc.reserved,
        model_free_split_bytes=split,
        model_free_whole_bytes=whole,
        model_largest_free_bytes=largest,
        gpu_frames=frames[where] if frames else "",
    )


# -- a job's arithmetic program against its recorded history ---------------------------------------------------------


@dataclass(frozen=True)
class StreamEvent:
    alloc: bool
    key: int  # the history's address, or the program's handle
    nbytes: int
    label: str  # the history's innermost frame, or the program's component


@dataclass(frozen=True)
class SegmentMade:
    segment_bytes: int
    request_bytes: int
    label: str
    position: int  # index into the stream's events


@dataclass(frozen=True)
class StreamComparison:
    """One CUDA stream: what the recorded requests and the program's each reserve (the allocator model on both, so
    the difference is the events'), the segments made (size -> count), and the first large-pool segment that differs
    with the events just before it on each side."""

    stream: int  # the program's stream (0: compute; FSDP2's all-gather 1, reduce-scatter 2)
    history_stream: int  # the CUDA stream id in the history
    history_reserved_bytes: int
    program_reserved_bytes: int
    history_segments: dict[int, int]
    program_segments: dict[int, int]
    first_difference: tuple[SegmentMade, SegmentMade] | None
    history_context: list[StreamEvent]
    program_context: list[StreamEvent]


def history_streams(doc: dict[str, Any], depth: int = 1) -> dict[int, list[StreamEvent]]:
    """The history's allocations and frees per CUDA stream, labelled with their innermost `depth` frames."""
    frames: list[str] = doc["frames"]
    out: dict[int, list[StreamEvent]] = defaultdict(list)
    stream_of: dict[int, int] = {}
    labels: dict[int, str] = {}
    for action, addr, size, stream, fid in doc["events"]:
        if action == "alloc":
            label = " < ".join(frames[fid].split(" < ")[:depth])
            stream_of[addr], labels[addr] = stream, label
            out[stream].append(StreamEvent(True, addr, size, label))
        elif action == "free_completed" and addr in stream_of:
            out[stream_of.pop(addr)].append(StreamEvent(False, addr, size, labels.pop(addr)))
    return dict(out)


def program_streams(prog: Program) -> dict[int, list[StreamEvent]]:
    """The program's allocations and frees per stream, labelled with their component."""
    out: dict[int, list[StreamEvent]] = defaultdict(list)
    stream_of: dict[int, int] = {}
    handle = 0
    for ev in prog.events:
        if ev > 0:
            handle += 1
            cat = prog.categories[handle]
            stream_of[handle] = prog.streams.get(cat, 0)
            out[stream_of[handle]].append(StreamEvent(True, handle, ev, cat))
        elif ev < 0:
            out[stream_of[-ev]].append(StreamEvent(False, -ev, prog.sizes[-ev], prog.categories[-ev]))
    return dict(out)


def _segments(events: list[StreamEvent]) -> tuple[int, list[SegmentMade]]:
    pool = CachingAllocator()
    blocks: dict[int, Block] = {}
    made: list[SegmentMade] = []
    for i, ev in enumerate(events):
        if ev.alloc:
            before = pool.reserved
            blocks[ev.key] = pool.malloc(ev.nbytes)
            if pool.reserved > before:
                made.append(SegmentMade(pool.reserved - before, ev.nbytes, ev.label, i))
        elif ev.key in blocks:
            pool.free(blocks.pop(ev.key))
    return pool.peak_reserved, made


def compare_program(doc: dict[str, Any], prog: Program, context: int = 24, depth: int = 1) -> list[StreamComparison]:
    """Each stream of `prog` against the history's stream used in the same order (the compute stream first, then
    the side streams by their first allocation: FSDP2's all-gather stream is used before its reduce-scatter stream),
    both replayed through the allocator model. `context` events before the first differing large-pool segment are
    kept from each side."""
    hist = history_streams(doc, depth)
    ours = program_streams(prog)
    side = [s for s in hist if s != 0]  # in the order of their first allocation (history_streams keeps it)
    pairs = [(0, 0), *zip(sorted(s for s in ours if s != 0), side, strict=False)]
    out = []
    for mine, theirs in pairs:
        h_events, p_events = hist.get(theirs, []), ours.get(mine, [])
        h_res, h_made = _segments(h_events)
        p_res, p_made = _segments(p_events)
        h_large = [m for m in h_made if m.segment_bytes > SMALL_BUFFER]
        p_large = [m for m in p_made if m.segment_bytes > SMALL_BUFFER]
        first = None
        for a, b in zip(h_large, p_large, strict=False):
            if a.segment_bytes != b.segment_bytes:
                first = (a, b)
                break
        if first is None and len(h_large) != len(p_large):
            k = min(len(h_large), len(p_large))
            if k < len(h_large):
                first = (h_large[k], SegmentMade(0, 0, "(none)", len(p_events)))
            else:
                first = (SegmentMade(0, 0, "(none)", len(h_events)), p_large[k])
        out.append(
            StreamComparison(
                stream=mine,
                history_stream=theirs,
                history_reserved_bytes=h_res,
                program_reserved_bytes=p_res,
                history_segments=_count(h_made),
                program_segments=_count(p_made),
                first_difference=first,
                history_context=h_events[max(0, first[0].position - context) : first[0].position + 1] if first else [],
                program_context=p_events[max(0, first[1].position - context) : first[1].position + 1] if first else [],
            )
        )
    return out


def _count(made: list[SegmentMade]) -> dict[int, int]:
    counts: dict[int, int] = defaultdict(int)
    for m in made:
        counts[m.segment_bytes] += 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[0]))
