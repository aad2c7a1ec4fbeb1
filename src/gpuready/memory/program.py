"""A job as the ordered allocations and frees it makes on the GPU (coarse: one event per tensor that matters).

The estimator describes forward, backward and optimizer steps as such a program; this module keeps the running
total (peak allocated and, per phase, where it peaked) and hands the event list to the caching-allocator model
for peak reserved. The breakdown by component at a peak is computed afterwards by one pass over the events, so
building a program costs one append per event.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import MutableSequence
from dataclasses import dataclass, field, fields
from itertools import accumulate
from typing import Any

from gpuready.memory import native

# PyTorch rounds every allocation up to a multiple of 512 bytes (kMinBlockSize, c10/cuda/CUDACachingAllocator.cpp)
ROUND = 512


def rounded(nbytes: int) -> int:
    return max(ROUND, (nbytes + ROUND - 1) // ROUND * ROUND) if nbytes > 0 else 0


@dataclass(frozen=True)
class SpanShape:
    """A run of events summed up from the allocated total at its start: the total's change at its end (`net`), its
    highest point just after an allocation (`high`, reached first after event `high_at`) and the largest
    allocation (`largest`); with no allocation, `high_at` is -1."""

    net: int
    high: int
    high_at: int
    largest: int


def span_shape(events: list[int], freed: list[int]) -> SpanShape:
    """The shape of `events` (+size, -handle), `freed[k]` being the size of the handle freed by event k."""
    if not events:
        return SpanShape(0, 0, -1, 0)
    totals = list(accumulate([ev if ev > 0 else -n for ev, n in zip(events, freed, strict=True)]))
    lowest = min(totals) - 1
    # the total just after each allocation (lower than any total where the event frees)
    after_alloc = [t if ev > 0 else lowest for t, ev in zip(totals, events, strict=True)]
    largest = max(events)
    if largest <= 0:
        return SpanShape(totals[-1], 0, -1, 0)
    high = max(after_alloc)
    return SpanShape(totals[-1], high, after_alloc.index(high), largest)


# `on_new`: called with every Program made in this thread while memory/template.py records a program with the batch
# as a symbol (absent otherwise; per thread, so that programs built meanwhile in other threads are plain)
HOOKS = threading.local()


@dataclass
class Program:
    """Ordered allocations and frees with a running total. Sizes are rounded as the allocator rounds them."""

    # allocator.replay's encoding: +size allocates and takes the next id (1, 2, ...), -id frees that id, 0 empties
    # the cache (torch.cuda.empty_cache(): every wholly free cached segment back to the device). A program
    # a batch template writes out (memory/template.py) keeps both as the int64 arrays the compiled loops made.
    events: MutableSequence[int] = field(default_factory=list)
    sizes: MutableSequence[int] = field(default_factory=lambda: [0])  # handle -> rounded bytes (handle 0: nothing)
    categories: list[str] = field(default_factory=lambda: [""])  # handle -> component
    allocated: int = 0
    peak_allocated: int = 0
    phase: str = "load"
    phase_peaks: dict[str, int] = field(default_factory=dict)
    phase_peak_events: dict[str, int] = field(default_factory=dict)  # phase -> events before its peak
    # category -> CUDA stream (0 is the compute stream): the caching allocator keeps each stream's blocks apart
    streams: dict[str, int] = field(default_factory=dict)
    # a cached segment the replay does not see but that is held at the peak (cuDNN's largest workspace)
    cached_outside_bytes: int = 0
    largest_request: int = 0  # the largest single allocation after loading (the fit rule keeps room for one)
    step_starts: list[int] = field(default_factory=list)  # events before each optimizer step (mark_step)
    # the current phase's peak so far and whether it is "load" (kept by set_phase: alloc runs once per event)
    _phase_peak: int = field(default=-1, init=False, repr=False, compare=False)
    _loading: bool = field(default=True, init=False, repr=False, compare=False)
    # int64 copies for the compiled loops (memory/native.py), made on first use: events, sizes, category codes
    _arrays: dict[str, array[int]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _names: list[str] = field(default_factory=list, init=False, repr=False, compare=False)  # for the codes

    def __post_init__(self) -> None:
        self.set_phase(self.phase)
        hook = getattr(HOOKS, "on_new", None)
        if hook is not None:
            hook(self)

    def __eq__(self, other: object) -> bool:
        """Field for field, the events and sizes by value (a list and an int64 array of the same numbers are the
        same program)."""
        if not isinstance(other, Program):
            return NotImplemented
        for f in fields(self):
            if not f.compare:
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, array) or isinstance(theirs, array):
                mine, theirs = list(mine), list(theirs)
            if mine != theirs:
                return False
        return True

    def set_phase(self, name: str) -> None:
        self.phase = name
        self._phase_peak = self.phase_peaks.get(name, -1)
        self._loading = name == "load"

    def mark_step(self) -> None:
        """An optimizer step starts here (training programs): the replay is told that the last step may repeat the
        one before it (repeat_span)."""
        self.step_starts.append(len(self.events))

    def from_batch(self, batch: Any, first: int) -> bool:
        """Whether the job's batch is `first` or more: a program that differs below a batch (eager attention's
        operand copies, which one sequence does not need). While a batch template records the program (its batch a
        symbol) the answer is yes and the template holds from `first` up (memory/template.py)."""
        return bool(batch >= first)

    def repeat_span(self) -> tuple[int, int] | None:
        """(start, at) of the last two steps when they have as many events and the second ends the program: the
        replay's hint (allocator.replay's `repeat`; it checks the hint before it uses it). None otherwise."""
        if len(self.step_starts) < 2:
            return None
        start, at = self.step_starts[-2:]
        return (start, at) if start < at and at - start == len(self.events) - at else None

    def alloc(self, category: str, nbytes: int) -> int:
        """Allocate a tensor of `nbytes`; returns its handle (0-byte tensors get handle 0 and take nothing)."""
        n = int(nbytes)
        if n <= 0:
            return 0
        size = (n + ROUND - 1) // ROUND * ROUND  # rounded(n): at least ROUND for n >= 1
        sizes = self.sizes
        sizes.append(size)
        self.categories.append(category)
        events = self.events
        events.append(size)
        allocated = self.allocated = self.allocated + size
        if size > self.largest_request and not self._loading:
            self.largest_request = size
        if allocated > self._phase_peak:
            self._phase_peak = self.phase_peaks[self.phase] = allocated
            self.phase_peak_events[self.phase] = len(events)
            if allocated > self.peak_allocated:
                self.peak_allocated = allocated
        return len(sizes) - 1

    def append_span(self, events: list[int], sizes: list[int], categories: list[str], shape: SpanShape) -> None:
        """Append `events` as alloc and free would have made them (a recorded span written out again, memory/lm/
        memo.py): allocations take the next handles with `sizes` (rounded) and `categories`; frees name handles of
        this program; `shape` sums the span up (span_shape), so the running totals move as alloc and free would
        move them."""
        self.sizes.extend(sizes)
        self.categories.extend(categories)
        start = len(self.events)
        self.events.extend(events)
        before = self.allocated
        self.allocated = before + shape.net
        if shape.largest > self.largest_request and not self._loading:
            self.largest_request = shape.largest
        top = before + shape.high
        if shape.high_at >= 0 and top > self._phase_peak:
            self._phase_peak = self.phase_peaks[self.phase] = top
            self.phase_peak_events[self.phase] = start + shape.high_at + 1
            if top > self.peak_allocated:
                self.peak_allocated = top

    def alloc_many(self, category: str, sizes: list[int]) -> list[int]:
        """[alloc(category, n) for n in sizes], in one pass."""
        if not sizes or min(sizes) <= 0 or "alloc" in vars(self):  # (0-byte tensors, or a template's recording)
            return [self.alloc(category, n) for n in sizes]
        rounded = [(int(n) + ROUND - 1) // ROUND * ROUND for n in sizes]
        first = len(self.sizes)
        self.sizes.extend(rounded)
        self.categories.extend([category] * len(rounded))
        start = len(self.events)
        self.events.extend(rounded)
        self.allocated = top = self.allocated + sum(rounded)
        if not self._loading:
            self.largest_request = max(self.largest_request, max(rounded))
        if top > self._phase_peak:  # (sizes are positive: the total is highest at the end)
            self._phase_peak = self.phase_peaks[self.phase] = top
            self.phase_peak_events[self.phase] = start + len(rounded)
            if top > self.peak_allocated:
                self.peak_allocated = top
        return list(range(first, first + len(rounded)))

    def free(self, handle: int) -> None:
        if handle == 0:
            return
        self.events.append(-handle)
        self.allocated -= self.sizes[handle]

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache() here: the allocator gives every wholly free cached segment back (event 0)."""
        self.events.append(0)

    def free_all(self, handles: list[int]) -> None:
        for h in handles:
            self.free(h)

    def transient(self, category: str, *sizes: int) -> None:
        """Tensors that live together for a moment and are freed (e.g. an op's output and its temporaries)."""
        self.free_all([self.alloc(category, s) for s in sizes])

    def size_of(self, handle: int) -> int:
        return self.sizes[handle]

    def replay_events(self) -> MutableSequence[int]:
        """The events in the form the allocator replay takes fastest: int64 for the compiled one, else the list."""
        return self.event_array() if native.replay_function() is not None else self.events

    def event_array(self) -> array[int]:
        """The events as int64 (for the compiled replay and breakdown; made once, after the program is built)."""
        if isinstance(self.events, array):
            return self.events
        made = self._arrays.get("events")
        if made is None or len(made) != len(self.events):
            made = self._arrays["events"] = array("q", self.events)
        return made

    def category_codes(self) -> tuple[list[str], array[int]]:
        """The categories by number, and each handle's category as that number (made once; a template hands its
        own to the programs it writes out)."""
        codes = self._arrays.get("codes")
        if codes is None or len(codes) != len(self.categories) or not self._names:
            self._names = list(dict.fromkeys(self.categories))
            number = {name: i for i, name in enumerate(self._names)}
            codes = self._arrays["codes"] = array("q", [number[c] for c in self.categories])
        return self._names, codes

    def breakdown(self, phase: str) -> dict[str, int]:
        """Live bytes per component at the peak of `phase`."""
        end = self.phase_peak_events.get(phase, 0)
        if len(self.sizes) > 1000:  # (below that the Python loop is as quick)
            names, codes = self.category_codes()
            sizes = self.sizes if isinstance(self.sizes, array) else self._arrays.get("sizes")
            if sizes is None or len(sizes) != len(self.sizes):
                sizes = self._arrays["sizes"] = array("q", self.sizes)
            live = native.live_by_code(self.event_array(), end, codes, sizes, len(names))
            if live is not None:
                return {name: n for name, n in zip(names, live, strict=True) if n}
        return self._breakdown_python(end)

    def _breakdown_python(self, end: int) -> dict[str, int]:
        by_cat: dict[str, int] = {}
        handle = 0
        sizes, cats = self.sizes, self.categories
        for ev in self.events[:end]:
            if ev > 0:
                handle += 1
                by_cat[cats[handle]] = by_cat.get(cats[handle], 0) + sizes[handle]
            elif ev < 0:
                by_cat[cats[-ev]] -= sizes[-ev]
        return {k: v for k, v in by_cat.items() if v}

    def handle_streams(self) -> list[int] | None:
        """The CUDA stream of each handle (index = handle), or None when everything runs on stream 0."""
        if not self.streams:
            return None
        get = self.streams.get
        return [get(c, 0) for c in self.categories]

    def split_streams(self) -> list[list[int]]:
        """The events of each stream (index = stream), each renumbered for its own replay."""
        count = max(self.streams.values(), default=0) + 1
        streams: list[list[int]] = [[] for _ in range(count)]
        where: dict[int, tuple[int, int]] = {}  # handle -> (stream, id within the stream)
        counts = [0] * count
        handle = 0
        get = self.streams.get
        for ev in self.events:
            if ev > 0:
                handle += 1
                s = get(self.categories[handle], 0)
                counts[s] += 1
                where[handle] = (s, counts[s])
                streams[s].append(ev)
            elif ev < 0:
                s, i = where[-ev]
                streams[s].append(-i)
            else:  # empty_cache releases every stream's cached segments
                for events in streams:
                    events.append(0)
        return streams
