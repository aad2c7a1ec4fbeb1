"""Events per second of the caching-allocator simulation on a synthetic training-like trace.

Usage: PYTHONPATH=src python benchmarks/allocator_speed.py [--events N]
The trace mixes long-lived parameter-sized blocks, activation stacks freed in reverse, and short temporaries,
with sizes from 512 B to 500 MiB, so both pools, splitting and merging are exercised.
"""

from __future__ import annotations

import argparse
import random
import time

from gpuready.memory.allocator import replay


def synthetic_trace(n_events: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    events: list[int] = []
    next_id = 1
    live: list[int] = []
    sizes = [512, 4096, 65536, 700_000, 3_000_000, 8_000_000, 40_000_000, 300_000_000]
    while len(events) < n_events:
        # a "layer": a few activations kept, temporaries freed at once
        for _ in range(rng.randint(2, 6)):
            events.append(rng.choice(sizes) + rng.randrange(0, 4096))
            live.append(next_id)
            next_id += 1
        for _ in range(rng.randint(1, 4)):
            events.append(rng.choice(sizes))
            events.append(-next_id)
            next_id += 1
        if len(live) > 200 or rng.random() < 0.05:  # "backward": free in reverse
            while live:
                events.append(-live.pop())
    return events


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=500_000)
    args = parser.parse_args()
    events = synthetic_trace(args.events)
    start = time.perf_counter()
    stats = replay(events)
    seconds = time.perf_counter() - start
    print(f"events: {len(events)}")
    print(f"seconds: {seconds:.3f}")
    print(f"events/s: {len(events) / seconds:,.0f}")
    print(f"peak allocated: {stats.peak_allocated_bytes}  peak reserved: {stats.peak_reserved_bytes}")


if __name__ == "__main__":
    main()
