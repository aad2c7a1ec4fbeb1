"""DistributedDataParallel's gradient buckets (torch/nn/parallel/distributed.py and the C++ Reducer)."""

from __future__ import annotations

# DDP's bucket caps (torch/distributed/constants.py and DistributedDataParallel(bucket_cap_mb=25)): the first
# bucket closes at 1 MiB, every later one at 25 MiB (reducer.cpp compute_bucket_assignment_by_size)
DDP_FIRST_BUCKET_BYTES = 1024**2
DDP_BUCKET_BYTES = 25 * 1024**2


def ddp_bucket_sizes(grad_bytes: list[int]) -> list[int]:
    """Bytes of each gradient bucket for gradients in the order they become ready: a bucket takes gradients
    until it holds at least its cap."""
    sizes: list[int] = []
    current = 0
    for nbytes in grad_bytes:
        current += nbytes
        if current >= (DDP_BUCKET_BYTES if sizes else DDP_FIRST_BUCKET_BYTES):
            sizes.append(current)
            current = 0
    if current:
        sizes.append(current)
    return sizes
