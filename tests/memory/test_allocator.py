"""The caching-allocator simulation, rule by rule, sizes computed by hand from CUDACachingAllocator.cpp."""

from __future__ import annotations

import random

import pytest

from gpuready.memory.allocator import (
    MIB,
    AllocatorOutOfMemory,
    CachingAllocator,
    replay,
    replay_reference,
    round_size,
    segment_size,
)


def test_round_size_to_512_bytes() -> None:
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(4000) == 4096


def test_segment_sizes_per_pool() -> None:
    assert segment_size(512) == 2 * MIB  # small pool
    assert segment_size(MIB) == 2 * MIB  # 1 MiB is still small
    assert segment_size(MIB + 512) == 20 * MIB  # 1-10 MiB: a 20 MiB segment
    assert segment_size(10 * MIB - 512) == 20 * MIB
    assert segment_size(10 * MIB) == 10 * MIB  # own segment, rounded to 2 MiB
    assert segment_size(11 * MIB) == 12 * MIB


def test_small_requests_share_one_2mib_segment() -> None:
    a = CachingAllocator()
    blocks = [a.malloc(1000) for _ in range(4)]  # 4 x 1024 B
    assert a.reserved == 2 * MIB
    assert a.allocated == 4 * 1024
    for b in blocks:
        a.free(b)
    assert a.allocated == 0
    assert a.reserved == 2 * MIB  # cached, not released
    assert a.peak_allocated == 4096


def test_small_remainder_kept_when_at_least_512_bytes() -> None:
    a = CachingAllocator()
    a.malloc(2 * MIB - 512)  # small? no: > 1 MiB -> large pool
    assert a.reserved == 20 * MIB
    b = CachingAllocator()
    x = b.malloc(MIB)  # small pool, 2 MiB segment, remainder 1 MiB kept
    y = b.malloc(MIB - 512)  # fits the remainder, leaves 512 B: still split
    z = b.malloc(512)  # takes the last 512 B
    assert b.reserved == 2 * MIB
    assert b.allocated == 2 * MIB
    for blk in (x, y, z):
        b.free(blk)
    assert b.allocated == 0


def test_large_remainder_not_split_when_at_most_1mib() -> None:
    a = CachingAllocator()
    big = a.malloc(12 * MIB)  # own segment of 12 MiB, no remainder
    a.free(big)
    # 11.5 MiB from the cached 12 MiB block: remainder 0.5 MiB <= 1 MiB -> whole block handed out
    blk = a.malloc(11 * MIB + 512 * 1024)
    assert a.allocated == 12 * MIB
    assert a.reserved == 12 * MIB
    a.free(blk)
    # 10.5 MiB: remainder 1.5 MiB > 1 MiB -> split, only the request counts as allocated
    a.malloc(10 * MIB + 512 * 1024)
    assert a.allocated == 10 * MIB + 512 * 1024


def test_large_new_segment_split_when_remainder_over_1mib() -> None:
    a = CachingAllocator()
    a.malloc(2 * MIB)  # 20 MiB segment, 18 MiB remainder cached
    assert a.reserved == 20 * MIB
    a.malloc(3 * MIB)  # served from the remainder
    assert a.reserved == 20 * MIB
    assert a.allocated == 5 * MIB
    a.malloc(11 * MIB)  # 15 MiB left, 11 MiB fits: still no new segment
    assert a.reserved == 20 * MIB
    a.malloc(5 * MIB)  # 4 MiB left: new 20 MiB segment
    assert a.reserved == 40 * MIB


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    a = CachingAllocator()
    b30 = a.malloc(30 * MIB)
    b12 = a.malloc(12 * MIB)
    b16 = a.malloc(16 * MIB)
    for b in (b30, b12, b16):
        a.free(b)
    got = a.malloc(14 * MIB)  # 16 MiB block is the best fit, remainder 2 MiB > 1 MiB -> split
    assert got.addr == b16.addr
    assert a.allocated == 14 * MIB
    again = a.malloc(11 * MIB)  # 12 MiB block, remainder 1 MiB -> not split
    assert again.addr == b12.addr
    assert a.allocated == 14 * MIB + 12 * MIB
    assert a.reserved == 58 * MIB


def test_free_merges_neighbours_so_a_larger_request_fits() -> None:
    a = CachingAllocator()
    x = a.malloc(5 * MIB)
    y = a.malloc(5 * MIB)
    z = a.malloc(5 * MIB)  # all three in one 20 MiB segment, 5 MiB left
    assert a.reserved == 20 * MIB
    a.free(x)
    a.free(z)  # merges with the 5 MiB tail -> 10 MiB free block
    a.free(y)  # merges both sides -> the whole 20 MiB segment is free again
    a.malloc(18 * MIB)
    assert a.reserved == 20 * MIB


def test_unmerged_fragments_force_a_new_segment() -> None:
    a = CachingAllocator()
    x = a.malloc(5 * MIB)
    a.malloc(5 * MIB)  # y stays allocated and separates x from the tail
    a.malloc(5 * MIB)
    a.free(x)
    # free: x (5 MiB) and the tail (5 MiB), not adjacent: a 9 MiB request needs a new segment
    a.malloc(9 * MIB)
    assert a.reserved == 40 * MIB
    assert a.peak_reserved == 40 * MIB


def test_pools_are_separate() -> None:
    a = CachingAllocator()
    big = a.malloc(4 * MIB)
    a.free(big)
    a.malloc(4096)  # small request never takes a large-pool block
    assert a.reserved == 22 * MIB


def test_capacity_releases_cached_unsplit_segments_then_retries() -> None:
    a = CachingAllocator(capacity_bytes=100 * MIB)
    x = a.malloc(60 * MIB)
    a.free(x)  # cached 60 MiB segment
    a.malloc(50 * MIB)  # takes the cached 60 MiB block (split: remainder 10 MiB)
    y = a.malloc(30 * MIB)  # 60 + 30 = 90 MiB reserved
    a.free(y)
    # 50 MiB: nothing cached fits (10 and 30 MiB free); 90 + 50 > 100 -> release the unsplit 30 MiB
    # segment (the 60 MiB one is split, it stays), then 60 + 50 = 110 > 100: still out of memory
    with pytest.raises(AllocatorOutOfMemory):
        a.malloc(50 * MIB)
    assert a.reserved == 60 * MIB
    a.malloc(40 * MIB)  # 60 + 40 fits after the release
    assert a.reserved == 100 * MIB
    assert a.releases == 1


def test_without_capacity_nothing_is_released() -> None:
    a = CachingAllocator()
    for n in (30, 40, 50):
        b = a.malloc(n * MIB)
        a.free(b)
    assert a.reserved == 30 * MIB + 40 * MIB + 50 * MIB
    assert a.allocated == 0


def test_replay_events_and_peaks() -> None:
    events = [4 * MIB, 12 * MIB, -1, 2 * MIB, -2, -3]
    stats = replay(events)
    # 4 MiB -> new 20 MiB segment; 12 MiB from its 16 MiB remainder (4 MiB left, split);
    # free 4 MiB; 2 MiB from a 4 MiB free block: one segment all along
    assert stats.peak_allocated_bytes == 16 * MIB
    assert stats.peak_allocated_event == 1
    assert stats.peak_reserved_bytes == 20 * MIB
    assert stats.peak_reserved_event == 0
    assert stats.allocated_bytes == 0
    assert stats.reserved_bytes == 20 * MIB
    assert stats.segments == 1
    assert stats.oom_event is None


def test_replay_reports_oom() -> None:
    stats = replay([30 * MIB, 30 * MIB, 30 * MIB], capacity_bytes=64 * MIB)
    assert stats.oom_event == 2
    assert stats.peak_reserved_bytes == 60 * MIB


def test_double_free_is_an_error() -> None:
    with pytest.raises(ValueError):
        replay([1024, -1, -1])


def test_large_segments_are_placed_below_earlier_ones_and_ties_go_to_the_lowest_address() -> None:
    # the CUDA driver hands large segments out at falling addresses (recorded H200 histories): of two equal cached
    # blocks the allocator, which prefers the lowest address, reuses the one from the newer segment
    alloc = CachingAllocator()
    first, second = alloc.malloc(40 * MIB), alloc.malloc(40 * MIB)
    assert second.addr < first.addr
    alloc.free(first)
    alloc.free(second)
    assert alloc.malloc(40 * MIB).addr == second.addr
    small_a, small_b = alloc.malloc(2 * 1024), alloc.malloc(1 * MIB)
    assert small_a.addr < small_b.addr  # the second small request needs a second 2 MiB segment, placed above


def _random_trace(rng: random.Random, n: int) -> list[int]:
    """Allocations of every pool's sizes (small, 1-10 MiB, own segments, some exactly equal) and frees in random
    order, so that splits, merges with either neighbour and reuse all happen."""
    sizes = [1, 512, 700, 4096, MIB - 100, MIB, MIB + 1, 3 * MIB, 9 * MIB, 10 * MIB, 33 * MIB, 200 * MIB]
    live: list[int] = []
    events: list[int] = []
    count = 0
    for _ in range(n):
        if live and rng.random() < 0.45:
            events.append(-live.pop(rng.randrange(len(live))))
        else:
            base = rng.choice(sizes)
            events.append(base if rng.random() < 0.5 else base + rng.randrange(1, 4 * MIB))
            count += 1
            live.append(count)
    return events


def test_fast_replay_gives_every_stat_of_the_one_call_per_event_replay() -> None:
    rng = random.Random(14)
    for _ in range(40):
        events = _random_trace(rng, 600)
        peak = replay_reference(events).peak_reserved_bytes
        for cap in (None, peak // 3, peak // 2, peak * 3 // 4, peak * 9 // 10, peak - MIB, peak):
            assert replay(events, cap) == replay_reference(events, cap)


def test_fast_replay_refuses_a_double_free() -> None:
    with pytest.raises(ValueError, match="freed twice"):
        replay([1000, -1, -1])
