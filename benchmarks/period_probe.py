"""How periodic are the estimator's allocation programs, and does the allocator's state repeat with them?

python benchmarks/period_probe.py [--quick] [--top N]

An analysis, not a fast path: nothing in src/ uses it. For every distinct single-stream program of the exactness
check's sweep (benchmarks/speed_check.py), it

1. finds the program's layer period from the event stream alone: each event is written relative to its position
   (an allocation as its size, a free as how many allocations ago its handle was made), so the events of layer k
   and layer k+1 are equal token by token exactly when they are the same up to a constant handle offset; the
   period P is the shift (up to MAX_PERIOD events) whose runs of equal tokens at least 2P long cover the most
   events, then the same among the events left (up to 4 periods: forward, backward, decoding differ);
2. replays the program through CachingAllocator (the reference model) and, at each period boundary inside those
   runs, takes the state's summary: allocated, reserved, segments, and each pool's cached free blocks as a sorted
   list of sizes;
3. counts, per run, the boundaries from which on the summary changes by the same step every period (allocated,
   reserved and segments by constant deltas, each pool's free-block sizes by the same multiset of blocks added
   and taken away), the state compared every m periods for m = 1..8 (it may repeat only every few layers). Those
   are the periods a skip could apply arithmetically, if the equivalence were proven; the count is an upper
   bound, because an equal step is necessary for an exact skip but not sufficient (ties between equal-sized free
   blocks go to the lowest address, and which block a free merges with depends on which live handles sit next
   to it).

Prints one row per program and the totals: events, events in periodic runs, events after the state has settled
(the skippable share, upper bound), and the replay's time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_check import sweep

MAX_PERIOD = 4000
MAX_STRIDE = 8  # state periods of up to this many layers are looked for


def tokens(events: list[int]) -> np.ndarray:
    """Each event relative to its position: allocation -> 2*size, free of the handle made d allocations ago ->
    2*d+1 (so shifted copies of a layer give equal tokens)."""
    out = np.empty(len(events), dtype=np.int64)
    made = 0
    for i, ev in enumerate(events):
        if ev > 0:
            made += 1
            out[i] = 2 * ev
        elif ev < 0:
            out[i] = 2 * (made - (-ev)) + 1
        else:
            out[i] = 0
    return out


def runs_of(match: np.ndarray, min_len: int) -> list[tuple[int, int]]:
    """(start, length) of the runs of True in `match` at least min_len long."""
    if not match.any():
        return []
    m = np.concatenate(([False], match, [False])).astype(np.int8)
    d = np.diff(m)
    starts = np.flatnonzero(d == 1)
    ends = np.flatnonzero(d == -1)
    return [(int(s), int(e - s)) for s, e in zip(starts, ends, strict=True) if e - s >= min_len]


def find_period(tok: np.ndarray, taken: np.ndarray) -> tuple[int, list[tuple[int, int]]]:
    """The shift whose long runs (tok[i] == tok[i+P] for at least 2P events in a row, so three copies or more)
    outside the events already `taken` cover the most events; ties to the smallest shift. Returns (P, runs as
    (start, events covered), each a whole number of periods)."""
    n = len(tok)
    best_p, best_cover, best_runs = 0, 0, []
    for p in range(1, min(MAX_PERIOD, n // 3) + 1):
        match = (tok[:-p] == tok[p:]) & ~taken[:-p] & ~taken[p:]
        if match.sum() < 2 * p:
            continue
        runs = [(s, (ln + p) // p * p) for s, ln in runs_of(match, 2 * p)]
        cover = sum(ln for _, ln in runs)
        if cover > best_cover:
            best_p, best_cover, best_runs = p, cover, runs
    return best_p, best_runs


def find_periods(tok: np.ndarray, rounds: int = 4) -> list[tuple[int, list[tuple[int, int]]]]:
    """Greedy: the best period, then the best among the events it left, `rounds` times (forward, backward and
    decoding repeat with different periods)."""
    taken = np.zeros(len(tok), dtype=bool)
    found = []
    for _ in range(rounds):
        p, runs = find_period(tok, taken)
        if not p:
            break
        for s, ln in runs:
            taken[s : s + ln] = True
        found.append((p, runs))
    return found


def summary(alloc: Any) -> tuple[int, int, int, Counter[int], Counter[int]]:
    small = Counter(k[0] for k in alloc._small.keys)
    large = Counter(k[0] for k in alloc._large.keys)
    return alloc.allocated, alloc.reserved, alloc.segments, small, large


def same_step(a: Any, b: Any, c: Any) -> bool:
    """b -> c changes allocated, reserved, segments and each pool's free-block sizes (as multisets: the blocks
    added and the blocks taken away) exactly as a -> b did."""
    if any(c[j] - b[j] != b[j] - a[j] for j in range(3)):
        return False
    return all(c[j] - b[j] == b[j] - a[j] and b[j] - c[j] == a[j] - b[j] for j in (3, 4))


def settled_periods(events: list[int], p: int, runs: list[tuple[int, int]]) -> tuple[int, list[str]]:
    """Replay through CachingAllocator; per run, the periods from the first boundary after which every later
    period changes the state summary by the same step. Returns (events in those periods, notes)."""
    from gpuready.memory.allocator import CachingAllocator

    boundaries: dict[int, int] = {}  # event index -> run index
    for r, (s, ln) in enumerate(runs):
        for b in range(s, s + ln + 1, p):
            boundaries[b] = r
    alloc = CachingAllocator(None)
    handles: list[Any] = [None]
    snaps: dict[int, list[tuple[int, int, int, Counter[int], Counter[int]]]] = {}
    for i, ev in enumerate(events):
        if i in boundaries:
            snaps.setdefault(boundaries[i], []).append(summary(alloc))
        if ev > 0:
            handles.append(alloc.malloc(ev))
        elif ev < 0:
            alloc.free(handles[-ev])
            handles[-ev] = None
    if len(events) in boundaries:
        snaps.setdefault(boundaries[len(events)], []).append(summary(alloc))
    skippable = 0
    notes = []
    for r, seq in snaps.items():
        # the state may repeat only every m layers (the small pool's 2 MiB segments and the large pool's 20 MiB
        # ones fill over several layers): for each stride m, the longest tail of boundaries m periods apart with
        # a constant step; the first two strides of it must be replayed to learn the step
        best_m, best = 1, 0
        for m in range(1, MAX_STRIDE + 1):
            for phase in range(m):
                sub = seq[phase::m]
                k = len(sub) - 1
                while k >= 2 and same_step(sub[k - 2], sub[k - 1], sub[k]):
                    k -= 1
                settled = max(0, len(sub) - 1 - k - 1) * m
                if settled > best:
                    best_m, best = m, settled
        skippable += best * p
        notes.append(f"run@{runs[r][0]}: {len(seq) - 1} periods, {best} after settling (stride {best_m})")
    return skippable, notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--top", type=int, default=0, help="print the first N programs' rows (-1: all)")
    parser.add_argument("--job", action="append", default=[], help="a job as JSON fields (not the sweep)")
    args = parser.parse_args()

    from gpuready.errors import InputError
    from gpuready.memory.allocator import replay
    from gpuready.memory.estimate import _program, fsdp_meta_init
    from gpuready.models import resolve_model
    from gpuready.workload import make_workload

    seen: set[tuple[int, ...]] = set()
    tot_events = tot_periodic = tot_skip = 0
    tot_time = 0.0
    rows = 0
    jobs = [json.loads(j) for j in args.job] if args.job else sweep(args.quick)
    for fields in jobs:
        try:
            w = make_workload(**fields)
            spec = resolve_model(w.model)
            prog = _program(spec, w, fsdp_meta_init(spec, w, None))
        except InputError:
            continue
        if prog.handle_streams() is not None:
            continue
        key = tuple(prog.events)  # the whole program: the first events and the length do not tell batches apart
        if key in seen:
            continue
        seen.add(key)
        ev = prog.events
        t0 = time.perf_counter()
        replay(ev, None)
        t_replay = time.perf_counter() - t0
        tok = tokens(ev)
        periodic = skip = 0
        notes: list[str] = []
        for p, runs in find_periods(tok):
            periodic += sum(ln for _, ln in runs)
            s, n = settled_periods(ev, p, runs)
            skip += s
            notes += [f"P={p} {x}" for x in n]
        tot_events += len(ev)
        tot_periodic += periodic
        tot_skip += skip
        tot_time += t_replay
        rows += 1
        if rows <= args.top or args.top < 0:
            label = " ".join(f"{k}={v}" for k, v in fields.items())
            print(
                f"{label}: {len(ev)} events, periodic {periodic} ({periodic / len(ev):.0%}), "
                f"settled {skip} ({skip / len(ev):.0%}); replay {t_replay * 1000:.1f} ms; " + "; ".join(notes[:4])
            )
    print(
        f"{rows} single-stream programs: {tot_events} events, {tot_periodic} in periodic runs "
        f"({tot_periodic / max(tot_events, 1):.0%}), {tot_skip} after the state summary settled "
        f"({tot_skip / max(tot_events, 1):.0%}, an upper bound on what a proven skip could leave out); "
        f"replay {tot_time:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
