"""A job as the ordered allocations and frees it makes on the GPU (coarse: one event per tensor that matters).

The estimator describes forward, backward and optimizer steps as such a program; this module keeps the running
total (peak allocated, the phase and the per-component breakdown at the peak) and hands the event list to the
caching-allocator model for peak reserved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# PyTorch rounds every allocation up to a multiple of 512 bytes (kMinBlockSize, c10/cuda/CUDACachingAllocator.cpp)
ROUND = 512


def rounded(nbytes: int) -> int:
    return max(ROUND, (nbytes + ROUND - 1) // ROUND * ROUND) if nbytes > 0 else 0


@dataclass
class Program:
    """Ordered allocations and frees with a running total. Sizes are rounded as the allocator rounds them."""

    # allocator.replay's encoding: +size allocates and takes the next id (1, 2, ...), -id frees that id
    events: list[int] = field(default_factory=list)
    live: dict[int, tuple[str, int]] = field(default_factory=dict)
    allocated: int = 0
    peak_allocated: int = 0
    phase: str = "load"
    peak_phase: str = "load"
    phase_peaks: dict[str, int] = field(default_factory=dict)
    phase_breakdowns: dict[str, dict[str, int]] = field(default_factory=dict)
    side_stream: frozenset[str] = frozenset()  # categories allocated on another CUDA stream
    # a cached segment the replay does not see but that is held at the peak (cuDNN's largest workspace)
    cached_outside_bytes: int = 0
    _by_cat: dict[str, int] = field(default_factory=dict)
    _next: int = 0
    _cats: dict[int, str] = field(default_factory=dict)

    def set_phase(self, name: str) -> None:
        self.phase = name

    def alloc(self, category: str, nbytes: int) -> int:
        """Allocate a tensor of `nbytes`; returns its handle (0-byte tensors get handle 0 and take nothing)."""
        size = rounded(int(nbytes))
        if size == 0:
            return 0
        self._next += 1
        handle = self._next
        self.events.append(size)
        if self.side_stream:
            self._cats[handle] = category
        self.live[handle] = (category, size)
        self.allocated += size
        self._by_cat[category] = self._by_cat.get(category, 0) + size
        if self.allocated > self.phase_peaks.get(self.phase, -1):
            self.phase_peaks[self.phase] = self.allocated
            self.phase_breakdowns[self.phase] = {k: v for k, v in self._by_cat.items() if v}
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
            self.peak_phase = self.phase
        return handle

    def free(self, handle: int) -> None:
        if handle == 0:
            return
        category, size = self.live.pop(handle)
        self.events.append(-handle)
        self.allocated -= size
        self._by_cat[category] -= size

    def free_all(self, handles: list[int]) -> None:
        for h in handles:
            self.free(h)

    def transient(self, category: str, *sizes: int) -> None:
        """Tensors that live together for a moment and are freed (e.g. an op's output and its temporaries)."""
        self.free_all([self.alloc(category, s) for s in sizes])

    def split_streams(self) -> tuple[list[int], list[int]]:
        """The events of the main stream and of the side stream, each renumbered for its own replay."""
        streams: tuple[list[int], list[int]] = ([], [])
        where: dict[int, tuple[int, int]] = {}  # handle -> (stream, id within the stream)
        counts = [0, 0]
        cats = self._cats
        handle = 0
        for ev in self.events:
            if ev > 0:
                handle += 1
                s = 1 if cats[handle] in self.side_stream else 0
                counts[s] += 1
                where[handle] = (s, counts[s])
                streams[s].append(ev)
            else:
                s, i = where[-ev]
                streams[s].append(-i)
        return streams
