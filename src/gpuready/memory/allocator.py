"""A simulation of PyTorch's CUDA caching allocator (default settings), to turn a job's sequence of tensor
allocations and frees into `max_memory_allocated` and `max_memory_reserved`.

The rules follow c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch, native backend, one stream, default
`PYTORCH_CUDA_ALLOC_CONF`: no `max_split_size_mb`, no `roundup_power2_divisions`, no garbage-collection
threshold, `expandable_segments:False`) and ../shared/calibration/NOTES.md:

- every request is rounded up to a multiple of 512 B (`kMinBlockSize`), at least 512 B;
- requests of at most 1 MiB (`kSmallSize`) are served from the small pool, whose segments are 2 MiB
  (`kSmallBuffer`); larger requests from the large pool: under 10 MiB (`kMinLargeAlloc`) a new segment is
  20 MiB (`kLargeBuffer`), otherwise the request rounded up to 2 MiB (`kRoundLarge`);
- a request takes the smallest cached free block of its pool that is large enough (ties: lowest address);
- the block is split when the remainder is at least 512 B (small pool) or more than 1 MiB (large pool);
  otherwise the whole block is handed out and counted as allocated (`stats.allocated_bytes += block->size`);
- a freed block merges with free neighbours of the same segment and returns to its pool's cache;
- segments go back to the device only when a new segment does not fit the device: then every cached
  segment that is wholly free (not split) is released and the request retried; if it still does not
  fit, the allocation fails (the job's OOM). This is the order of `malloc` in CUDACachingAllocator.cpp:
  `alloc_block`, then `release_available_cached_blocks` (a no-op by default: it returns at once while
  `max_split_size` is unlimited), then `release_cached_blocks` and `alloc_block` again. The device's
  limit is `set_per_process_memory_fraction`'s `allowed_memory_maximum` when one is set (what
  `gpuready trial --gpu-memory` sets): `alloc_block` refuses a segment that would take the reserved
  total over it;
- each CUDA stream has its own cached blocks (a block freed on one stream serves only that stream's
  requests; BlockPool orders by stream first), while the device limit is shared by all streams.

`allocated` counts the block sizes handed out (rounded), `reserved` the segments held from the device.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from gpuready.memory.native import ERRORS, NativeReplay, replay_function
from gpuready.units import MIB

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every request is rounded up to a multiple of this
SMALL_SIZE = 1 * MIB  # kSmallSize: largest request served from the small pool
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: segment size of the small pool
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: segment size for large-pool requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB  # kRoundLarge: requests of MIN_LARGE_ALLOC and more get their own segment, rounded
# the model's segment addresses (only their order matters: CachingAllocator._place): small-pool segments at and above
# SMALL_BASE, large-pool ones below it; all below 2**49 while the reserve is under 2**47 B, so `replay`'s pool keys
# `size << ADDR_BITS | address` order by size, then address
SMALL_BASE = 1 << 48
ADDR_BITS = 50


class AllocatorOutOfMemory(Exception):
    """A request that does not fit the device even after releasing every cached unsplit segment."""

    def __init__(self, nbytes: int, allocated: int, reserved: int, capacity: int) -> None:
        self.nbytes = nbytes
        super().__init__(
            f"out of memory: tried to allocate {nbytes} B with {allocated} B allocated, "
            f"{reserved} B reserved, capacity {capacity} B"
        )


def round_size(nbytes: int) -> int:
    """The size the allocator actually hands out for a request (CUDACachingAllocator round_size)."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return (nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE * MIN_BLOCK_SIZE


def segment_size(size: int) -> int:
    """The size of the new segment taken from the device for a rounded request (get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class Block:
    """A piece of a segment: allocated, or cached free in its pool."""

    __slots__ = ("addr", "allocated", "next", "prev", "size", "small", "stream")

    def __init__(self, addr: int, size: int, small: bool, stream: int = 0) -> None:
        self.addr = addr
        self.size = size
        self.small = small
        self.stream = stream
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None


class _Pool:
    """Cached free blocks ordered by (size, address), as the allocator's BlockPool set."""

    __slots__ = ("blocks", "keys")

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], Block] = {}

    def add(self, block: Block) -> None:
        key = (block.size, block.addr)
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: Block) -> None:
        key = (block.size, block.addr)
        i = bisect.bisect_left(self.keys, key)
        del self.keys[i]
        del self.blocks[key]

    def take_best_fit(self, size: int) -> Block | None:
        i = bisect.bisect_left(self.keys, (size, -1))
        if i == len(self.keys):
            return None
        key = self.keys.pop(i)
        return self.blocks.pop(key)


@dataclass(frozen=True)
class AllocatorStats:
    """What torch.cuda.memory_stats() would say at the end of a replay, plus where the peaks happened.

    peak_*_event: index into the replayed events of the event right after which the peak was first reached
    (-1 if nothing was allocated). oom_event: index of the allocation that failed, else None (the replay
    stops there).
    """

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_event: int
    peak_reserved_event: int
    segments: int
    releases: int  # how many times cached segments were released to retry an allocation
    oom_event: int | None = None


class CachingAllocator:
    """One device's caching allocator. `capacity_bytes` is what the allocator may take from the device
    (the GPU's memory minus the CUDA context); None means unlimited, so nothing is ever released."""

    def __init__(self, capacity_bytes: int | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.segments = 0
        self.releases = 0
        self._small, self._large = _Pool(), _Pool()  # stream 0's (the compute stream's) pools, the hot path
        self._pools: dict[tuple[int, bool], _Pool] = {(0, True): self._small, (0, False): self._large}
        # segment addresses only decide ties between equal-sized cached blocks (lowest address first); the CUDA
        # driver hands small-pool segments out at rising addresses and large ones mostly at falling addresses
        # (13 recorded H200 traces: 80-95% of consecutive small segments rise, 60-95% of large ones fall), and with
        # that placement the replay of the recorded requests reproduces every trace's reserve exactly
        self._next_small_addr = SMALL_BASE
        self._next_large_addr = SMALL_BASE
        self._segment_heads: dict[int, Block] = {}  # segment start address -> first block

    # -- the two calls ---------------------------------------------------------------------------------
    def _pool(self, stream: int, small: bool) -> _Pool:
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[(stream, small)] = _Pool()
        return pool

    def malloc(self, nbytes: int, stream: int = 0) -> Block:
        """Allocate `nbytes` on `stream`; returns the block as the handle for `free`."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = (self._small if small else self._large) if stream == 0 else self._pool(stream, small)
        block = pool.take_best_fit(size)
        if block is None:
            block = self._new_segment(size, small, stream)
        remaining = block.size - size
        if remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE:
            rest = Block(block.addr + size, remaining, small, stream)
            rest.prev = block
            rest.next = block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.add(rest)
        block.allocated = True
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block

    def free(self, block: Block) -> None:
        """Return a block to its pool's cache, merged with its free neighbours."""
        if not block.allocated:
            raise ValueError("block freed twice")
        block.allocated = False
        self.allocated -= block.size
        stream = block.stream
        pool = (self._small if block.small else self._large) if stream == 0 else self._pool(stream, block.small)
        prev = block.prev
        if prev is not None and not prev.allocated:
            pool.remove(prev)
            prev.size += block.size
            prev.next = block.next
            if block.next is not None:
                block.next.prev = prev
            block = prev
        nxt = block.next
        if nxt is not None and not nxt.allocated:
            pool.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        pool.add(block)

    # -- segments --------------------------------------------------------------------------------------
    def _new_segment(self, size: int, small: bool, stream: int = 0) -> Block:
        seg = segment_size(size)
        cap = self.capacity_bytes
        if cap is not None and self.reserved + seg > cap:
            self.release_cached()
            self.releases += 1
            if self.reserved + seg > cap:
                raise AllocatorOutOfMemory(size, self.allocated, self.reserved, cap)
        block = Block(self._place(seg, small), seg, small, stream)
        self._segment_heads[block.addr] = block
        self.segments += 1
        self.reserved += seg
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        return block

    def _place(self, seg: int, small: bool) -> int:
        """The address of a new segment of `seg` bytes. A gap is left so that segments are never adjacent (blocks
        only merge within their segment)."""
        if small:
            addr = self._next_small_addr
            self._next_small_addr += seg + ROUND_LARGE
            return addr
        self._next_large_addr -= seg + ROUND_LARGE
        return self._next_large_addr

    def release_cached(self) -> int:
        """Give every wholly free cached segment back to the device (release_cached_blocks); returns bytes."""
        released = 0
        for pool in self._pools.values():
            for block in [b for b in pool.blocks.values() if b.prev is None and b.next is None]:
                pool.remove(block)
                del self._segment_heads[block.addr]
                released += block.size
                self.segments -= 1
        self.reserved -= released
        return released


def replay(
    events: Iterable[int],
    capacity_bytes: int | None = None,
    streams: list[int] | None = None,
    repeat: tuple[int, int] | None = None,
) -> AllocatorStats:
    """Replay a trace: a positive number allocates that many bytes and gets the next id (1, 2, ...);
    a negative number `-k` frees the allocation with id `k`; 0 is torch.cuda.empty_cache() (every wholly free
    cached segment goes back to the device; not counted in `releases`, which counts the releases a limit forced).
    `streams[k]`: the CUDA stream of allocation `k` (all on stream 0 when None); `capacity_bytes`: the
    device's limit for the allocator's reserve (None: unlimited).

    The same rules as CachingAllocator, written as one loop over plain ints for speed: a block is its start
    address; the cached free blocks of each pool are a sorted list of keys `size << ADDR_BITS | address` (the
    BlockPool order: smallest size, then lowest address) with two dicts from a free block's start to its size
    and from its end to its start (a freed block merges with the free block ending where it starts and the
    one starting where it ends: segments are never adjacent, so these are its neighbours in its segment).
    Events on several streams take replay_reference. benchmarks/replay_check.py checks the two agree. Where
    memory/native.py can build it, the compiled loop (memory/_replay.c) runs instead of the Python one: the same
    results (tests/memory/test_native.py).

    `repeat` = (start, at): a hint that the events from `at` to the end are those from `start` to `at` again (a
    program's last two optimizer steps, Program.repeat_span). The compiled loop checks it at `at` and, where the
    allocator's state and the events there are the same up to the allocation ids, stops: the span would run as the
    one before it ran, so it changes no figure (_replay.c gives the argument). A wrong hint costs only the check;
    the figures are the same with it or without it, and the Python loops ignore it."""
    if streams is not None:
        return replay_reference(events, capacity_bytes, streams)
    native = replay_function()
    if native is not None:
        return _replay_native(native, events, capacity_bytes, repeat)
    return _replay_one_stream(events, capacity_bytes)


def _replay_native(
    native: NativeReplay, events: Iterable[int], capacity_bytes: int | None, repeat: tuple[int, int] | None = None
) -> AllocatorStats:
    """`_replay_one_stream` compiled (memory/_replay.c, through memory/native.py): the same stats."""
    evs = events if isinstance(events, (list, tuple, array)) else list(events)
    rc, out = native(evs, -1 if capacity_bytes is None else capacity_bytes, repeat)
    if rc:
        if rc == 3:
            raise MemoryError(ERRORS[rc])
        raise ValueError(f"event {out[9]}: allocation {-evs[out[9]]} {ERRORS[rc]}")
    return AllocatorStats(
        peak_allocated_bytes=out[0],
        peak_reserved_bytes=out[1],
        allocated_bytes=out[2],
        reserved_bytes=out[3],
        peak_allocated_event=out[4],
        peak_reserved_event=out[5],
        segments=out[6],
        releases=out[7],
        oom_event=None if out[8] < 0 else out[8],
    )


def _replay_one_stream(events: Iterable[int], capacity_bytes: int | None) -> AllocatorStats:
    # every name the loop reads is a local (methods bound once, the module's constants copied): this loop is most of
    # an estimate's time, and a local read is cheaper than a global or attribute one
    bisect_left = bisect.bisect_left
    insort = bisect.insort
    shift = ADDR_BITS
    small_size, min_large, small_buffer, large_buffer = SMALL_SIZE, MIN_LARGE_ALLOC, SMALL_BUFFER, LARGE_BUFFER
    round_large, small_base, min_block = ROUND_LARGE, SMALL_BASE, MIN_BLOCK_SIZE
    small_keys: list[int] = []  # the small pool's cached free blocks, as size << shift | addr, sorted
    large_keys: list[int] = []
    free_size: dict[int, int] = {}  # cached free block start -> size (both pools: addresses are unique)
    free_end: dict[int, int] = {}  # cached free block end -> start
    size_pop, end_pop = free_size.pop, free_end.pop
    seg_size: dict[int, int] = {}  # segment start -> segment size
    h_addr: list[int] = [0]  # allocation id -> block start (ids count from 1)
    h_size: list[int] = [0]  # allocation id -> block size handed out (0 once freed)
    addr_append, size_append = h_addr.append, h_size.append
    allocated = reserved = peak_a = peak_r = 0
    peak_a_event = peak_r_event = -1
    segments = releases = 0
    next_small = next_large = small_base
    cap = capacity_bytes
    oom: int | None = None
    i = -1
    for i, ev in enumerate(events):
        if ev > 0:
            size = (ev + 511) // 512 * 512  # round_size (MIN_BLOCK_SIZE is 512; ev >= 1 gives at least 512)
            small = size <= small_size
            keys = small_keys if small else large_keys
            j = bisect_left(keys, size << shift)
            if j < len(keys):
                key = keys.pop(j)
                bsize = key >> shift
                addr = key - (bsize << shift)
                del free_size[addr]
                del free_end[addr + bsize]
            else:
                # a new segment (CachingAllocator._new_segment)
                if small:
                    bsize = small_buffer
                elif size < min_large:
                    bsize = large_buffer
                else:
                    bsize = (size + round_large - 1) // round_large * round_large
                if cap is not None and reserved + bsize > cap:
                    # release_cached: every wholly free segment goes back to the device, then one retry
                    whole = [a for a, n in seg_size.items() if free_size.get(a) == n]
                    for a in whole:
                        n = seg_size.pop(a)
                        pool = small_keys if a >= small_base else large_keys
                        k = n << shift | a
                        del pool[bisect_left(pool, k)]
                        del free_size[a]
                        del free_end[a + n]
                        reserved -= n
                        segments -= 1
                    releases += 1
                    if reserved + bsize > cap:
                        oom = i
                        break
                if small:
                    addr = next_small
                    next_small += bsize + round_large
                else:
                    next_large -= bsize + round_large
                    addr = next_large
                seg_size[addr] = bsize
                segments += 1
                reserved += bsize
                if reserved > peak_r:  # the reserve grows only here
                    peak_r, peak_r_event = reserved, i
            remaining = bsize - size
            if remaining >= min_block if small else remaining > small_size:
                rest = addr + size
                insort(keys, remaining << shift | rest)
                free_size[rest] = remaining
                free_end[rest + remaining] = rest
                bsize = size
            addr_append(addr)
            size_append(bsize)
            allocated += bsize
            if allocated > peak_a:
                peak_a, peak_a_event = allocated, i
        elif ev < 0:
            k = -ev
            size = h_size[k]
            if size == 0:
                raise ValueError(f"event {i}: allocation {k} freed twice")
            h_size[k] = 0
            allocated -= size
            addr = h_addr[k]
            keys = small_keys if addr >= small_base else large_keys
            end = addr + size
            prev = end_pop(addr, None)
            if prev is not None:
                psize = size_pop(prev)
                del keys[bisect_left(keys, psize << shift | prev)]
                addr = prev
                size += psize
            nsize = size_pop(end, None)
            if nsize is not None:
                del keys[bisect_left(keys, nsize << shift | end)]
                del free_end[end + nsize]
                size += nsize
            insort(keys, size << shift | addr)
            free_size[addr] = size
            free_end[addr + size] = addr
        else:
            # torch.cuda.empty_cache(): every wholly free segment back to the device (not a release to retry)
            for a in [a for a, n in seg_size.items() if free_size.get(a) == n]:
                n = seg_size.pop(a)
                pool = small_keys if a >= small_base else large_keys
                del pool[bisect_left(pool, n << shift | a)]
                del free_size[a]
                del free_end[a + n]
                reserved -= n
                segments -= 1
    del i
    return AllocatorStats(
        peak_allocated_bytes=peak_a,
        peak_reserved_bytes=peak_r,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        peak_allocated_event=peak_a_event,
        peak_reserved_event=peak_r_event,
        segments=segments,
        releases=releases,
        oom_event=oom,
    )


def replay_reference(
    events: Iterable[int], capacity_bytes: int | None = None, streams: list[int] | None = None
) -> AllocatorStats:
    """The plain replay through CachingAllocator, one call per event: `replay`'s reference (the exactness check,
    benchmarks/replay_check.py, compares the two), and its path for events on several streams.

    Replay a trace: a positive number allocates that many bytes and gets the next id (1, 2, ...);
    a negative number `-k` frees the allocation with id `k`; 0 empties the cache (torch.cuda.empty_cache()).
    `streams[k]`: the CUDA stream of allocation `k` (all on stream 0 when None); `capacity_bytes`: the
    device's limit for the allocator's reserve (None: unlimited)."""
    alloc = CachingAllocator(capacity_bytes)
    handles: list[Block | None] = [None]
    free = alloc.free
    malloc = alloc.malloc if streams is None else (lambda n: alloc.malloc(n, streams[len(handles)]))
    peak_a = peak_r = 0
    peak_a_event = peak_r_event = -1
    oom: int | None = None
    i = -1
    for i, ev in enumerate(events):
        if ev > 0:
            try:
                handles.append(malloc(ev))
            except AllocatorOutOfMemory:
                oom = i
                break
            if alloc.allocated > peak_a:
                peak_a, peak_a_event = alloc.allocated, i
            if alloc.reserved > peak_r:
                peak_r, peak_r_event = alloc.reserved, i
        elif ev < 0:
            block = handles[-ev]
            if block is None:
                raise ValueError(f"event {i}: allocation {-ev} freed twice")
            handles[-ev] = None
            free(block)
        else:
            alloc.release_cached()  # torch.cuda.empty_cache()
    del i
    return AllocatorStats(
        peak_allocated_bytes=alloc.peak_allocated,
        peak_reserved_bytes=alloc.peak_reserved,
        allocated_bytes=alloc.allocated,
        reserved_bytes=alloc.reserved,
        peak_allocated_event=peak_a_event,
        peak_reserved_event=peak_r_event,
        segments=alloc.segments,
        releases=alloc.releases,
        oom_event=oom,
    )
