"""`estimate(workload)`: peak GPU memory of a job from its model's shapes, without torch.

The job is described as its sequence of GPU allocations (memory/lm.py, memory/vision.py); the running total
gives peak allocated, its phase and breakdown; a replay through the caching-allocator model
(memory/allocator.py) gives peak reserved.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from gpuready.errors import InputError
from gpuready.memory.allocator import replay
from gpuready.memory.program import Program
from gpuready.memory.result import MemoryEstimate
from gpuready.models import ModelSpec, resolve_model
from gpuready.workload import Workload

# CUDA context + cuBLAS/cuDNN workspaces outside the caching allocator: NVML used - max_memory_reserved at the end
# of each run in ../shared/calibration/h200.jsonl (device_overhead_bytes; torch 2.11, CUDA 13, H200). Training rows
# 787,283,968-808,255,488 B, median 804,061,184 (cuBLAS backward workspaces, cuDNN for convolutions); inference
# rows 728,563,712-743,243,776 B, median 741,146,624.
DEVICE_OVERHEAD_TRAIN_BYTES = 804_061_184
DEVICE_OVERHEAD_INFER_BYTES = 741_146_624
# A rank of a 2-GPU DDP or FSDP2 job also holds NCCL's communicator buffers: 1,687,027,712-1,695,416,320 B per GPU
# over the five 2-GPU rows of docs/calibration/h200_gpuready_multi_gpu.jsonl, median 1,691,222,016. Measured with
# two GPUs only; NCCL's buffers grow with the number of peers, so larger jobs may need more.
DEVICE_OVERHEAD_DISTRIBUTED_BYTES = 1_691_222_016

# `fits` and `max_batch` keep this share of the predicted reserve free, or room for the job's largest single
# allocation when that is more. Why: the reserve is predicted within a few percent (docs/accuracy.md), and the
# caching allocator fails at a fragmentation cliff when one large request finds no cached block although the total
# would fit. Both misses measured so far were exactly that, the fp32 logits: llama-3.2-1b, seq 2048, batch 11 on an
# emulated 80 GiB card (a 10.76 GiB block) and llama-3.2-3b, seq 1024, batch 11 at 80 GiB (5.38 GiB; the recorded
# history shows a sixth logits segment the program did not need; docs/max_batch.md). Lightning's batch-size finder
# keeps a 5% margin for the same reason (lightning/pytorch/tuner/batch_size_scaling.py).
FIT_MARGIN = 0.05


@dataclass(frozen=True)
class _Run:
    peak_allocated: int
    peak_reserved: int
    phase_peaks: dict[str, int]
    breakdown: dict[str, int]  # at the peak phase
    largest_request: int


def _run(spec: ModelSpec, w: Workload, meta_init: bool = False) -> _Run:
    prog = _program(spec, w, meta_init)
    if prog.streams:
        # the caching allocator keeps blocks per CUDA stream: FSDP2's all-gather and reduce-scatter buffers live on
        # their own streams, so their cache cannot serve the compute stream (and the reverse); replay each apart.
        # Nothing is released on an unlimited device, so the sum of the final reserves is the peak.
        reserved = sum(replay(events).peak_reserved_bytes for events in prog.split_streams())
    else:
        reserved = replay(prog.events).peak_reserved_bytes
    reserved = max(reserved, prog.peak_allocated + prog.cached_outside_bytes)
    phase = max(prog.phase_peaks, key=lambda p: prog.phase_peaks[p])
    return _Run(prog.peak_allocated, reserved, dict(prog.phase_peaks), prog.breakdown(phase), prog.largest_request)


def _program(spec: ModelSpec, w: Workload, meta_init: bool = False) -> Program:
    if spec.kind == "vision":
        from gpuready.memory.vision import vision_program

        return vision_program(spec, w)
    from gpuready.memory.lm import infer_program, train_program

    return train_program(spec, w, meta_init=meta_init) if w.training else infer_program(spec, w)


@functools.lru_cache(maxsize=4096)
def _core(
    spec: ModelSpec, w: Workload, meta_init: bool = False
) -> tuple[int, int, str, dict[str, int], dict[str, int], int]:
    """(peak allocated, peak reserved, phase, breakdown at the peak) for one GPU.

    The whole program is simulated at the model's real depth: the allocator's reserve does not grow linearly
    over the first layers (cached blocks are reused differently), so extrapolating from shallow copies of the
    model under-reserves by up to 10% (llama-3.2-1b, batch 1)."""
    run = _run(spec, w, meta_init)
    phase = max(run.phase_peaks, key=lambda p: run.phase_peaks[p])
    reserved = max(run.peak_reserved, run.peak_allocated)
    return run.peak_allocated, reserved, phase, run.breakdown, run.phase_peaks, run.largest_request


def _check_supported(spec: ModelSpec, w: Workload) -> None:
    if w.shard in ("zero1", "zero2", "zero3"):
        raise InputError("--shard", f"{w.shard} (DeepSpeed) is not modelled yet; allowed here: none, ddp, fsdp")
    if spec.kind == "vision" and w.shard == "fsdp":
        raise InputError("--shard", "fsdp is modelled for language models; use ddp or none for vision models")
    if w.task == "infer" and w.shard != "none":
        raise InputError("--shard", "inference is modelled on one GPU; drop --shard")


def device_overhead_bytes(w: Workload) -> int:
    if w.training and w.gpus > 1 and w.shard in ("ddp", "fsdp"):
        return DEVICE_OVERHEAD_DISTRIBUTED_BYTES
    return DEVICE_OVERHEAD_TRAIN_BYTES if w.training else DEVICE_OVERHEAD_INFER_BYTES


def trainable_params(spec: ModelSpec, w: Workload) -> int:
    if w.method == "full" or not w.training:
        return spec.params if w.training else 0
    from gpuready.memory.lm import lora_targets

    targets = lora_targets(spec, w)
    per_layer = sum(
        w.lora_r * (lin.in_features + lin.out_features) for lin in spec.block_linears if lin.name in targets
    )
    return per_layer * spec.layers


def estimate(
    workload: Workload,
    gpu_memory_bytes: int | None = None,
    *,
    spec: ModelSpec | None = None,
    find_max_batch: bool = True,
) -> MemoryEstimate:
    """Peak memory per GPU of `workload`; with `gpu_memory_bytes`, whether it fits and the largest batch."""
    spec = spec or resolve_model(workload.model)
    _check_supported(spec, workload)
    meta_init = fsdp_meta_init(spec, workload, gpu_memory_bytes)
    allocated, reserved, phase, breakdown, phases, largest = _core(spec, workload, meta_init)
    overhead = device_overhead_bytes(workload)
    breakdown = dict(sorted(breakdown.items(), key=lambda kv: -kv[1]))
    result = MemoryEstimate(
        model=spec.name,
        params=spec.params,
        trainable_params=trainable_params(spec, workload),
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        peak_device_bytes=reserved + overhead,
        phase=phase,
        breakdown=breakdown,
        assumptions=assumptions(spec, workload, meta_init, gpu_memory_bytes),
        phases=dict(phases),
        largest_request_bytes=largest,
    )
    if gpu_memory_bytes is None:
        return result
    device = reserved + overhead
    fits = needed_bytes(reserved, workload, largest) <= gpu_memory_bytes
    max_batch = largest_batch(spec, workload, gpu_memory_bytes, meta_init=meta_init) if find_max_batch else None
    mitigations = []
    if not fits and find_max_batch:
        from gpuready.memory.mitigations import suggest

        mitigations = [m.to_json() for m in suggest(workload, gpu_memory_bytes)]
    return replace(
        result,
        gpu_memory_bytes=gpu_memory_bytes,
        fits=fits,
        headroom_bytes=gpu_memory_bytes - device,
        max_batch=max_batch,
        mitigations=mitigations,
    )


def needed_bytes(reserved: int, w: Workload, largest_request: int = 0) -> int:
    """What a card must have for the job to be called a fit: the reserve, plus 5% of it or room for the largest
    single allocation (whichever is more), plus the context."""
    return reserved + max(math.ceil(reserved * FIT_MARGIN), largest_request) + device_overhead_bytes(w)


def needed_for_batch(spec: ModelSpec, w: Workload, batch: int, meta_init: bool = False) -> int:
    core = _core(spec, w.model_copy(update={"batch": batch}), meta_init)
    return needed_bytes(core[1], w, core[5])


def fsdp_meta_init(spec: ModelSpec, w: Workload, gpu_memory_bytes: int | None) -> bool:
    """Whether an FSDP job is taken as initialised on the meta device and loaded shard by shard. The measured
    FSDP2 jobs built the whole model on each GPU and then sharded it (its freed blocks stay in the reserve); a
    model whose whole weights do not fit the card cannot be built that way, so for it the build is left out. With
    no card named, the same test against the largest GPU in the catalog: a model no GPU can hold whole (a 405B
    model) is taken as initialised on the meta device or loaded on rank 0, not built whole on every GPU."""
    if w.shard != "fsdp" or w.gpus < 2:
        return False
    if gpu_memory_bytes is None:
        from gpuready.catalog.gpus import load_gpus

        gpu_memory_bytes = max(g.usable_bytes for g in load_gpus())
    from gpuready.memory.dtypes import dtypes_for

    return spec.params * dtypes_for(w).param + device_overhead_bytes(w) > gpu_memory_bytes


def largest_batch(
    spec: ModelSpec, w: Workload, capacity: int, limit: int = 1 << 16, *, meta_init: bool | None = None
) -> int:
    """Largest micro-batch that fits `capacity` by the rule `fits` uses (0 if batch 1 does not)."""
    meta = fsdp_meta_init(spec, w, capacity) if meta_init is None else meta_init
    if needed_for_batch(spec, w, 1, meta) > capacity:
        return 0
    lo, hi = 1, 2
    while hi <= limit and needed_for_batch(spec, w, hi, meta) <= capacity:
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if needed_for_batch(spec, w, mid, meta) <= capacity:
            lo = mid
        else:
            hi = mid
    return lo


def assumptions(
    spec: ModelSpec, w: Workload, meta_init: bool = False, gpu_memory_bytes: int | None = None
) -> list[str]:
    from gpuready.memory.dtypes import dtypes_for

    out = [
        ("per GPU; " if w.gpus > 1 else "one GPU; ")
        + "PyTorch caching allocator with default settings (expandable_segments off)",
        f"fits / max batch keep {FIT_MARGIN:.0%} of the predicted reserve free, or room for the largest single "
        "allocation when that is more (allocator fragmentation)",
        f"device overhead (CUDA context + cuBLAS/cuDNN workspaces"
        f"{' + NCCL buffers' if device_overhead_bytes(w) == DEVICE_OVERHEAD_DISTRIBUTED_BYTES else ''}) "
        f"{device_overhead_bytes(w) / 2**20:.0f} MiB, as measured on an H200 with torch 2.11",
    ]
    if spec.kind == "lm":
        from gpuready.memory.lm import make_ctx

        ctx = make_ctx(spec, w)
        kernels = {
            "flash": "FlashAttention (keeps q, k, v, output and log-sum-exp)",
            "efficient": "memory-efficient attention (keeps q, k, v, output and log-sum-exp)",
            "math": "SDPA math path (keeps batch×heads×seq² probabilities)",
            "eager": "eager attention (keeps batch×heads×seq² scores in fp32 and in the model dtype)",
        }
        out.append(f"attention kernel: {kernels[ctx.backend]}")
        if w.training:
            out.append("Hugging Face loss: logits upcast to fp32, log-softmax kept for backward")
            if w.method != "full":
                targets = ",".join(sorted(ctx.lora)) or "none"
                out.append(f"LoRA r={w.lora_r} on {targets}; adapters in fp32 (peft autocast_adapter_dtype)")
            if w.method == "qlora":
                out.append("QLoRA: NF4 weights with double quantization (bitsandbytes), 0.516 bytes/param")
            if w.grad_ckpt:
                out.append("gradient checkpointing: each layer's input kept, the layer recomputed in backward")
        elif w.new_tokens:
            out.append("generate(): KV cache grown by torch.cat each step (DynamicCache); last-position logits")
        else:
            out.append("one forward pass with use_cache=True over the whole prompt; logits for every position")
        if spec.experts:
            out.append(f"mixture of experts: {spec.experts_per_token} of {spec.experts} experts per token")
    dt = dtypes_for(w)
    if dt.autocast:
        out.append("mixed: fp32 weights, gradients and optimizer states; bf16 autocast copies of weights")
    if w.training:
        out.append(f"optimizer {w.optim} with PyTorch's default implementation (foreach on CUDA)")
    if w.shard == "fsdp":
        out.append(
            f"FSDP2 over {w.gpus} GPUs: parameters, gradients and optimizer states sharded; each layer "
            "gathered for its forward and backward (next one prefetched); the root stays gathered"
        )
        whole = spec.params * dtypes_for(w).param / 2**30
        if not meta_init:
            init = (
                "FSDP2 init: the whole model built on each GPU, then sharded (its freed blocks stay in the "
                "reserve); initialising on the meta device needs less"
            )
        elif gpu_memory_bytes is None:
            init = (
                f"FSDP2 init: the whole model ({whole:.1f} GiB of weights) fits no GPU in the catalog, so it is taken "
                "as initialised on the meta device (or loaded on rank 0 and broadcast), each GPU holding its shard"
            )
        else:
            init = (
                f"FSDP2 init: the whole model ({whole:.1f} GiB of weights) does not fit one GPU, so it is taken as "
                "built on the meta device and loaded shard by shard"
            )
        out.append(init)
    elif w.shard == "ddp":
        out.append(f"DDP over {w.gpus} GPUs: a full replica per GPU plus gradient buckets (a gradient-sized copy)")
    elif w.gpus > 1:
        out.append(f"--gpus {w.gpus} without --shard: each GPU runs its own copy; figures are per GPU")
    return out
