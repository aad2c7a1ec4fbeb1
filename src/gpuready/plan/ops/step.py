"""The whole optimizer step on one GPU (`training_ops`): grad_accum micro-batches, the optimizer and, on several
GPUs, DDP's gradient all-reduce or FSDP2's all-gathers and reduce-scatter as bytes on the link (`comm_ops`).
"""

from __future__ import annotations

from dataclasses import replace

from gpuready.memory.dtypes import dtypes_for
from gpuready.models.spec import ModelSpec
from gpuready.plan.ops.base import Op, _mem
from gpuready.plan.ops.lm import lm_ops
from gpuready.plan.ops.optimizer import optimizer_ops, trainable_params
from gpuready.plan.ops.vision import vision_ops
from gpuready.units import MIB
from gpuready.workload import Workload


def comm_ops(spec: ModelSpec, w: Workload) -> list[Op]:
    """Bytes each GPU sends per optimizer step. Ring all-reduce: 2(n-1)/n of the buffer; all-gather and
    reduce-scatter: (n-1)/n each (NCCL's bus-bandwidth definitions, nccl-tests doc/PERFORMANCE.md)."""
    n = w.gpus
    if n < 2 or w.shard == "none":
        return []
    pb = dtypes_for(w).param
    grads = trainable_params(spec, w) * pb
    frac = (n - 1) / n
    if w.shard == "fsdp" or w.shard == "zero3":
        params = spec.params * pb
        fwd = 2 if w.grad_ckpt else 1
        # FSDP2 gathers each layer's parameters for forward (again for checkpointing's recompute) and backward,
        # and reduce-scatters the gradients
        # FSDP2 copies the local shards into the all-gather buffer and the gathered buffer out into the
        # parameters (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather /
        # foreach_all_gather_copy_out), and the gradients into the reduce-scatter buffer
        # reshard_after_forward: gathered for forward and again for backward; checkpointing's recompute runs
        # inside the backward hook's gather, so it adds none
        del fwd
        gathers = 2 * w.grad_accum
        copies = params * gathers * (1 / n + 2) + grads * w.grad_accum * (2 + 2 / n)
        return [
            Op("comm", "comm", 0.0, frac * params * gathers, 2 * spec.layers, collective="all_gather"),
            Op("comm", "comm", 0.0, frac * grads * w.grad_accum, spec.layers, collective="reduce_scatter"),
            _mem("comm copies", copies, 4 * spec.layers * (gathers + w.grad_accum)),
        ]
    buckets = max(1, grads // (25 * MIB))  # DDP's 25 MiB buckets (bucket_cap_mb)
    # the reducer copies gradients into the buckets and the averaged buckets back (gradient_as_bucket_view=False)
    return [
        Op("comm", "comm", 0.0, 2 * frac * grads, buckets, collective="all_reduce"),
        _mem("comm copies", 4.0 * grads, 4 * buckets),
    ]


def training_ops(spec: ModelSpec, w: Workload) -> list[Op]:
    """Every op of one optimizer step on one GPU: grad_accum micro-batches, the optimizer, communication."""
    micro = lm_ops(spec, w) if spec.kind == "lm" else vision_ops(spec, w)
    a = w.grad_accum
    ops = [replace(o, flops=o.flops * a, bytes=o.bytes * a, kernels=o.kernels * a) for o in micro]
    shards = w.gpus if w.shard in ("fsdp", "zero3") else 1
    return ops + optimizer_ops(spec, w, shards) + comm_ops(spec, w)
