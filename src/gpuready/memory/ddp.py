"""DistributedDataParallel's gradient buckets (torch/nn/parallel/distributed.py and the C++ Reducer)."""

from __future__ import annotations

from gpuready.memory.program import Program
from gpuready.units import MIB

# DDP's bucket caps (torch/distributed/constants.py and DistributedDataParallel(bucket_cap_mb=25)): the first
# bucket closes at 1 MiB, every later one at 25 MiB (reducer.cpp compute_bucket_assignment_by_size)
DDP_FIRST_BUCKET_BYTES = 1 * MIB
DDP_BUCKET_BYTES = 25 * MIB


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


class DdpBuckets:
    """DistributedDataParallel's gradient buffers over a training run (gradient_as_bucket_view=False), as the
    recorded H200 history of ddp_llama1b shows them: a second copy of every gradient, one flat tensor, allocated
    when the model is wrapped (torch/nn/parallel/distributed.py, Reducer); at the second iteration's forward the
    buckets rebuilt in the order gradients became ready (Reducer._rebuild_buckets in DDP._pre_forward) before the
    old ones go; on rank 0 the first buffer stayed alive into that iteration's backward, so the worst rank holds
    both until then."""

    # When the first buffer goes, per recorded rank history: just before the rebuild on both ranks of ddp_qwen05,
    # ddp_lora_llama3b, ddp_resnet50 and ddp_qwen15_ckpt and on rank 1 of ddp_llama1b; only rank 0 of ddp_llama1b
    # held it into the next backward (its free was requested there, by the autograd thread). What holds it is not
    # known; without checkpointing the program keeps that worst rank's order (the peaks of the other jobs do not
    # depend on it), with gradient checkpointing it follows ddp_qwen15_ckpt (both ranks: freed before the rebuild;
    # the kept buffer had put the prediction +15.6% over).

    def __init__(self, prog: Program, grad_bytes: int) -> None:
        self.prog = prog
        self.first = prog.alloc("ddp_gradient_buckets", grad_bytes)

    def rebuild(self, ready_order: list[int], release_first: bool = False) -> None:
        """The second iteration's buckets, for gradients of these sizes in the order they became ready; with
        `release_first` the first buffer goes just before them."""
        if release_first:
            self.release_first()
        for nbytes in ddp_bucket_sizes(ready_order):
            self.prog.alloc("ddp_gradient_buckets", nbytes)

    def release_first(self) -> None:
        self.prog.free(self.first)
        self.first = 0
