"""`estimate(workload)`: peak GPU memory of a job from its model's shapes, without torch.

The job is described as its sequence of GPU allocations (memory/lm/, memory/vision.py); the running total
gives peak allocated, its phase and breakdown; a replay through the caching-allocator model
(memory/allocator.py) gives peak reserved.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, replace

from gpuready.errors import InputError
from gpuready.memory.allocator import replay
from gpuready.memory.fit import (
    MARGIN_NOTE,
    MAX_BATCH_RULE,
    RULE,
    Fit,
    Replayable,
    allocator_limit,
    fit_margin_bytes,
    judge,
)
from gpuready.memory.program import Program
from gpuready.memory.result import MemoryEstimate
from gpuready.memory.template import Template, build_template
from gpuready.models import ModelSpec, resolve_model
from gpuready.search import largest_passing
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


@dataclass(frozen=True)
class _Run:
    peak_allocated: int
    peak_reserved: int  # the replay's, or live tensors plus the cached segment outside it when that is more
    replay_reserved: int  # the replay's alone
    phase: str
    phase_peaks: dict[str, int]
    largest_request: int


def _run(spec: ModelSpec, w: Workload, meta_init: bool = False) -> _Run:
    prog = _program(spec, w, meta_init)
    if prog.streams:
        # the caching allocator keeps blocks per CUDA stream: FSDP2's all-gather and reduce-scatter buffers live on
        # their own streams, so their cache cannot serve the compute stream (and the reverse); replay each apart.
        # Nothing is released on an unlimited device, so the sum of the final reserves is the peak.
        replayed = sum(replay(events).peak_reserved_bytes for events in prog.split_streams())
        allocated = prog.peak_allocated
    else:
        result = replay(prog.replay_events(), repeat=prog.repeat_span())
        replayed = result.peak_reserved_bytes
        # the allocator's count, as torch.cuda.max_memory_allocated reports it: whole blocks (sizes rounded, and a
        # cached block handed out unsplit when what is left would be too small), not the tensors' requested bytes
        allocated = max(result.peak_allocated_bytes, prog.peak_allocated)
    reserved = max(replayed, prog.peak_allocated + prog.cached_outside_bytes, allocated)
    phase = max(prog.phase_peaks, key=lambda p: prog.phase_peaks[p])
    return _Run(
        allocated,
        reserved,
        replayed,
        phase,
        dict(prog.phase_peaks),
        prog.largest_request,
    )


@functools.lru_cache(maxsize=256)
def _breakdown(spec: ModelSpec, w: Workload, meta_init: bool, phase: str) -> dict[str, int]:
    """Live bytes per component at the peak of `phase`, largest first: one pass over the program, made only for the
    estimates returned (a max-batch search's batches do not need it)."""
    parts = _program(spec, w, meta_init).breakdown(phase)
    return dict(sorted(parts.items(), key=lambda kv: -kv[1]))


@functools.lru_cache(maxsize=32)
def _program(spec: ModelSpec, w: Workload, meta_init: bool = False) -> Program:
    """The job's allocation program (the last few kept: the replay under a card's limit reads it again). The first
    batch of a job is built; from the second, the job's batch template (memory/template.py) writes it out, where the
    program is affine in the batch."""
    structure = w.model_copy(update={"batch": 1})
    if len(_first_batch) > 4096:
        _first_batch.clear()
    first = _first_batch.setdefault((spec, structure, meta_init), w.batch)
    if first != w.batch:
        template = template_for(spec, structure, meta_init, w.batch)
        if template is not None:
            return template.instantiate(w.batch)
    return _build(spec, w, meta_init)


def template_for(spec: ModelSpec, structure: Workload, meta_init: bool, batch: int) -> Template | None:
    """The batch template that writes out `batch` of the job structure (its batch 1): the structure's own, or where
    that holds from a later batch only (a builder takes another branch from there: Program.from_batch), the template
    of the batches below it; None where neither does. A batch sweep calls it before its threads start, so that they
    find the templates recorded (a recording is per thread: program.HOOKS and the template's batch range)."""
    template = _template(spec, structure, meta_init)
    if template is None or batch >= template.min_batch:
        return template
    if template.min_batch > 1:
        lower = _template_below(spec, structure, meta_init, template.min_batch)
        if lower is not None and lower.min_batch <= batch:
            return lower
    return None


_first_batch: dict[tuple[ModelSpec, Workload, bool], int] = {}  # job structure (batch 1) -> first batch built
TEMPLATE_FIRST = 0  # the "first batch" of a structure whose every batch comes from its template (no batch is 0)


def expect_many_batches(spec: ModelSpec, w: Workload, meta_init: bool = False) -> None:
    """Say that `w`'s structure will be estimated at many batches (a sweep): its first batch is then written out from
    the batch template too, instead of being built and the template recorded at the second (one build saved)."""
    _first_batch.setdefault((spec, w.model_copy(update={"batch": 1}), meta_init), TEMPLATE_FIRST)


@functools.lru_cache(maxsize=32)
def _template(spec: ModelSpec, structure: Workload, meta_init: bool) -> Template | None:
    return build_template(lambda w: _build(spec, w, meta_init), structure)


@functools.lru_cache(maxsize=32)
def _template_below(spec: ModelSpec, structure: Workload, meta_init: bool, below: int) -> Template | None:
    return build_template(lambda w: _build(spec, w, meta_init), structure, below=below)


def _build(spec: ModelSpec, w: Workload, meta_init: bool = False) -> Program:
    if spec.kind == "vision":
        from gpuready.memory.vision import vision_program

        return vision_program(spec, w)
    from gpuready.memory.lm.infer import infer_program
    from gpuready.memory.lm.programs import train_program

    return train_program(spec, w, meta_init=meta_init) if w.training else infer_program(spec, w)


@functools.lru_cache(maxsize=4096)
def _core_cached(spec: ModelSpec, w: Workload, meta_init: bool = False) -> _Run:
    return _run(spec, w, meta_init)


# the job being replayed in some thread -> its lock (estimate_cards' threads ask for the same batches)
_core_running: dict[tuple[ModelSpec, Workload, bool], threading.Lock] = {}
_core_guard = threading.Lock()


def _core(spec: ModelSpec, w: Workload, meta_init: bool = False) -> _Run:
    """Peaks, phase and breakdown at the peak for one GPU.

    The whole program is simulated at the model's real depth: the allocator's reserve does not grow linearly
    over the first layers (cached blocks are reused differently), so extrapolating from shallow copies of the
    model under-reserves by up to 10% (llama-3.2-1b, batch 1). Cached; a thread asking for a job another thread
    is replaying waits for that replay rather than making its own (plan's cards on threads asked for 4 of the 70B
    QLoRA job's 26 batches twice)."""
    key = (spec, w, meta_init)
    with _core_guard:
        lock = _core_running.setdefault(key, threading.Lock())
    try:
        with lock:
            return _core_cached(spec, w, meta_init)
    finally:
        with _core_guard:
            if _core_running.get(key) is lock:
                del _core_running[key]


@functools.lru_cache(maxsize=4096)
def _fit(spec: ModelSpec, w: Workload, gpu_memory_bytes: int, meta_init: bool = False) -> Fit:
    """The job on a card of `gpu_memory_bytes`, by the one fit rule (memory/fit.py)."""
    run = _core(spec, w, meta_init)

    def events() -> Replayable:
        prog = _program(spec, w, meta_init)
        streams = prog.handle_streams()
        if streams:
            return Replayable(prog.events, streams)
        return Replayable(prog.replay_events(), None, prog.repeat_span())

    return judge(
        gpu_memory_bytes,
        device_overhead_bytes(w),
        margin_kind(spec, w),
        largest_request=run.largest_request,
        unlimited_reserved=run.replay_reserved,
        peak_allocated=run.peak_allocated,
        extra_reserved=run.peak_reserved - run.replay_reserved,
        events=events,
    )


def clear_caches() -> None:
    """Forget every program, replay and verdict (for benchmarks that time distinct jobs)."""
    for cached in (_program, _core_cached, _fit, _live_peak, _breakdown, _template, _template_below):
        cached.cache_clear()
    _first_batch.clear()


def _kbit_prep_modelled(spec: ModelSpec, w: Workload) -> bool:
    """--kbit-prep follows the recorded LoRA layer (lm/kbit_prep.py), so it needs that layer on every layer."""
    from gpuready.memory.lm.context import make_ctx
    from gpuready.memory.lm.lora_recorded import lora_recorded

    if spec.kind != "lm" or w.gpus > 1:
        return False
    ctx = make_ctx(spec, w)
    return not spec.qk_norm and all(lora_recorded(ctx, layer) for layer in range(spec.layers))


def _check_supported(spec: ModelSpec, w: Workload) -> None:
    if w.kbit_prep and not _kbit_prep_modelled(spec, w):
        raise InputError(
            "--kbit-prep",
            "prepare_model_for_kbit_training is modelled on one GPU for plain decoders (llama, mistral, qwen2/3) "
            "with LoRA on all seven linears and flash or memory-efficient attention; measure others with "
            "`gpuready trial ... --kbit-prep`",
        )
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
    from gpuready.memory.lm.context import dense_lora, layer_linears, lora_targets
    from gpuready.memory.lm.moe import expert_adapter_params
    from gpuready.models.lora import default_lora_targets

    def adapters(layer: int, targets: frozenset[str]) -> int:
        lins = layer_linears(spec, layer)
        return sum(w.lora_r * (lin.in_features + lin.out_features) for lin in lins if lin.name in targets)

    targets = lora_targets(spec, w)
    # an MoE model's dense layers have their own MLP (lm/context.layer_linears); peft's adapters on the fused
    # experts (lm/moe.py)
    dense = spec.dense_layers * adapters(0, targets | dense_lora(spec, w)) if spec.dense_layers else 0
    moe = (spec.layers - spec.dense_layers) * adapters(spec.layers - 1, targets)
    wanted = set(w.lora_targets or default_lora_targets(spec))
    return dense + moe + expert_adapter_params(spec, w, wanted)


def estimate(
    workload: Workload,
    gpu_memory_bytes: int | None = None,
    *,
    spec: ModelSpec | None = None,
    find_max_batch: bool = True,
) -> MemoryEstimate:
    """Peak memory per GPU of `workload`; with `gpu_memory_bytes`, whether it fits and the largest batch."""
    spec = spec or resolve_model(workload.model, workload.as_family)
    _check_supported(spec, workload)
    meta_init = fsdp_meta_init(spec, workload, gpu_memory_bytes)
    if gpu_memory_bytes is not None and find_max_batch:
        # the max-batch search asks for several batches of this structure: write every one out of the batch
        # template, this one too, rather than build this batch and then record the template (one build saved)
        expect_many_batches(spec, workload, meta_init)
    run = _core(spec, workload, meta_init)
    overhead = device_overhead_bytes(workload)
    breakdown = dict(_breakdown(spec, workload, meta_init, run.phase))
    # what the allocator hands out beyond the tensors' bytes at the peak: sizes rounded to its blocks, and cached
    # blocks handed out whole when what would be left is too small to split off
    rounding = run.peak_allocated - sum(breakdown.values())
    if rounding > 0:
        breakdown["allocator_blocks"] = rounding
    result = MemoryEstimate(
        model=spec.name,
        params=spec.params,
        trainable_params=trainable_params(spec, workload),
        peak_allocated_bytes=run.peak_allocated,
        peak_reserved_bytes=run.peak_reserved,
        peak_device_bytes=run.peak_reserved + overhead,
        phase=run.phase,
        breakdown=breakdown,
        assumptions=assumptions(spec, workload, meta_init, gpu_memory_bytes),
        phases=dict(run.phase_peaks),
        largest_request_bytes=run.largest_request,
    )
    if gpu_memory_bytes is None:
        return result
    fit = _fit(spec, workload, gpu_memory_bytes, meta_init)
    max_batch = largest_batch(spec, workload, gpu_memory_bytes, meta_init=meta_init) if find_max_batch else None
    return with_fit(result, fit, max_batch, margin_kind(spec, workload))


def peak_and_fit(workload: Workload, gpu_memory_bytes: int, *, spec: ModelSpec | None = None) -> tuple[int, bool]:
    """(peak on the device, fits) of `workload` on a card of `gpu_memory_bytes`: the two figures of estimate() a
    mitigation shows (memory/mitigations.py), without the breakdown, assumptions and max batch estimate() adds."""
    spec = spec or resolve_model(workload.model, workload.as_family)
    _check_supported(spec, workload)
    meta_init = fsdp_meta_init(spec, workload, gpu_memory_bytes)
    run = _core(spec, workload, meta_init)
    fit = _fit(spec, workload, gpu_memory_bytes, meta_init)
    return run.peak_reserved + device_overhead_bytes(workload), bool(fit.fits)


def with_fit(result: MemoryEstimate, fit: Fit, max_batch: int | None, kind: str) -> MemoryEstimate:
    """`result` with its verdict on one card (both modes)."""
    rule_for_max = [MAX_BATCH_RULE] if max_batch is not None else []
    return replace(
        result,
        gpu_memory_bytes=fit.gpu_memory_bytes,
        fits=fit.fits,
        headroom_bytes=fit.headroom_bytes,
        max_batch=max_batch,
        allocator_limit_bytes=fit.limit_bytes,
        reserved_on_card_bytes=fit.reserved_bytes if fit.fits else None,
        cache_releases=fit.releases,
        fit_rule=RULE,
        assumptions=[*result.assumptions, RULE, MARGIN_NOTE[kind], *rule_for_max],
    )


def margin_kind(spec: ModelSpec, w: Workload) -> str:
    """Which measured margin of memory/fit.py applies to the job."""
    if spec.kind == "vision":
        if spec.model_type == "resnet":
            return "conv" if w.training else "conv_infer"
        return "vit_train" if w.training else "vit"
    if not w.training:
        return "generate" if w.new_tokens > 0 else "lm"
    return "lm_eager" if w.attn == "eager" and w.grad_ckpt else "lm"


def fits_at_batch(spec: ModelSpec, w: Workload, batch: int, gpu_memory_bytes: int, meta_init: bool = False) -> bool:
    # by way of the unlimited replay, cached per batch and shared by every card (`plan` asks for all of them): it
    # decides most batches alone; only those whose reserve is over the limit and live tensors under it replay again
    wb = w.model_copy(update={"batch": batch})
    allocated, largest = _live_peak(spec, wb, meta_init)
    limit = allocator_limit(gpu_memory_bytes, device_overhead_bytes(w))
    if allocated > limit - fit_margin_bytes(margin_kind(spec, w), largest, limit):
        return False  # live tensors alone over the limit: no replay needed (the rule's own first test)
    return _fit(spec, wb, gpu_memory_bytes, meta_init).fits


@functools.lru_cache(maxsize=4096)
def _live_peak(spec: ModelSpec, w: Workload, meta_init: bool = False) -> tuple[int, int]:
    """(peak allocated, largest single allocation) of the program, kept after the program itself is dropped."""
    prog = _program(spec, w, meta_init)
    return prog.peak_allocated, prog.largest_request


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


MAX_BATCH = 1 << 16  # the largest batch the searches consider (both modes)
MAX_BATCH_CHECKED = 8  # the batches right below max_batch that are checked too (memory/fit.py MAX_BATCH_RULE)


def largest_batch(
    spec: ModelSpec, w: Workload, capacity: int, limit: int = MAX_BATCH, *, meta_init: bool | None = None
) -> int:
    """Largest micro-batch that fits a card of `capacity` bytes by the fit rule (0 if batch 1 does not);
    memory/fit.py MAX_BATCH_RULE says what is claimed about the batches below it."""
    meta = fsdp_meta_init(spec, w, capacity) if meta_init is None else meta_init

    def test(batch: int) -> bool:
        return fits_at_batch(spec, w, batch, capacity, meta)

    if limit < 1 or not test(1):
        return 0
    if limit == 1 or not test(2):
        return 1
    # start where the live tensors alone would reach the limit (allocated grows about linearly with the batch;
    # the reserve under a limit comes close to it): usually a few replays instead of doubling from 1
    (one, _), (two, largest) = (_live_peak(spec, w.model_copy(update={"batch": b}), meta) for b in (1, 2))
    card_limit = allocator_limit(capacity, device_overhead_bytes(w))
    room = card_limit - fit_margin_bytes(margin_kind(spec, w), largest, card_limit)
    slope = two - one
    guess = 1 + (room - one) // slope if slope > 0 else limit
    guess = min(limit, max(2, guess))
    # fits need not be monotone in the batch (when the allocator releases its cache decides whether a large block
    # finds room: under a 20% margin qwen2.5-7b LoRA + checkpointing on 40 GiB fitted at 9 and 11, not 10), so the
    # answer is one with the MAX_BATCH_CHECKED batches below it fitting too (every smaller batch, for answers up to
    # that + 1)
    step = max(1, guess // 16)
    return largest_passing(test, 1, limit, start=guess, step=step, check_below=MAX_BATCH_CHECKED).value


def assumptions(
    spec: ModelSpec, w: Workload, meta_init: bool = False, gpu_memory_bytes: int | None = None
) -> list[str]:
    from gpuready.memory.dtypes import dtypes_for

    out = [
        ("per GPU; " if w.gpus > 1 else "one GPU; ")
        + "PyTorch caching allocator with default settings (expandable_segments off)",
        f"device overhead (CUDA context + cuBLAS/cuDNN workspaces"
        f"{' + NCCL buffers' if device_overhead_bytes(w) == DEVICE_OVERHEAD_DISTRIBUTED_BYTES else ''}) "
        f"{device_overhead_bytes(w) / 2**20:.0f} MiB, as measured on an H200 with torch 2.11",
    ]
    if spec.kind == "lm":
        from gpuready.memory.lm.context import make_ctx

        ctx = make_ctx(spec, w)
        kernels = {
            "flash": "FlashAttention (keeps q, k, v, output and log-sum-exp)",
            "efficient": "memory-efficient attention (keeps q, k, v, output and log-sum-exp)",
            "math": "SDPA math path (keeps batch×heads×seq² probabilities)",
            "eager": "eager attention (keeps batch×heads×seq² scores in fp32 and in the model dtype)",
        }
        out.append(f"attention kernel: {kernels[ctx.backend]}")
        if spec.model_type == "gemma2":
            out.append(
                "Gemma 2 with the attention asked for, as transformers 5.17 (measured) runs it; transformers 5.24 has "
                "no SDPA path for it and runs eager attention with soft-capped scores: size that with --attn eager "
                "(measured on the H200 with 5.17 asked for eager: held-out sets 42 and 43, -0.0 ... +0.3%)"
            )
        if w.training:
            out.append("Hugging Face loss: logits upcast to fp32, log-softmax kept for backward")
            if w.method != "full":
                targets = ",".join(sorted(ctx.lora)) or "none"
                kind = (
                    "bf16 (cast after peft, as TRL does)"
                    if w.lora_dtype == "bf16"
                    else "fp32 (peft autocast_adapter_dtype)"
                )
                out.append(f"LoRA r={w.lora_r} on {targets}; adapters in {kind}")
                if ctx.expert_lora:
                    out.append(
                        f"peft moves gate/up/down_proj onto the fused experts: gate_up_proj at rank "
                        f"{ctx.expert_lora.gate_up_rank}, down_proj at {ctx.expert_lora.down_rank}, each forward "
                        "building W + BA (kept for backward); dense MLPs and shared experts not adapted"
                    )
            if w.method == "qlora":
                out.append(
                    "QLoRA: bitsandbytes NF4 with double quantization (0.516 bytes/param), each weight loaded in "
                    f"{w.precision} and quantized, dequantized around every matmul; embeddings, norms and lm_head "
                    + (
                        "cast to fp32 by peft's prepare_model_for_kbit_training (--kbit-prep): fp32 residual stream, "
                        "norms and 4-bit linear outputs, autocast's bf16 copies around them; its "
                        "torch.cuda.empty_cache() after the casts (peft's auto_clear_cache, on by default in peft 0.21)"
                        if w.kbit_prep
                        else "stay in that dtype; give --kbit-prep if the script calls peft's "
                        "prepare_model_for_kbit_training (most QLoRA tutorials do: 15-35% more on 4 H200 jobs)"
                    )
                )
            if w.grad_ckpt:
                out.append("gradient checkpointing: each layer's input kept, the layer recomputed in backward")
        elif w.new_tokens:
            decoding = (
                "sampling (--decoding sample: temperature, top-k and top-p, whose sort of the fp32 logits holds "
                "about 44 bytes per vocabulary entry and row at once, then softmax and multinomial)"
                if w.decoding == "sample"
                else "greedy decoding (--decoding sample adds sampling's warpers: top-p sorts the fp32 logits)"
            )
            out.append(
                "generate(): KV cache grown by torch.cat each step (DynamicCache); last-position logits; "
                + decoding
                + " to the full --new-tokens"
                + (" (min_new_tokens' two processors)" if spec.eos_token else "")
            )
        else:
            out.append("one forward pass with use_cache=True over the whole prompt; logits for every position")
        if spec.experts:
            out.append(f"mixture of experts: {spec.experts_per_token} of {spec.experts} experts per token")
        if spec.family_gaps:  # the family's features the program leaves out (models/data/families.json)
            out.append(f"{spec.model_type}: not modelled: " + "; ".join(spec.family_gaps))
    dt = dtypes_for(w)
    if dt.autocast:
        out.append("mixed: fp32 weights, gradients and optimizer states; bf16 autocast copies of weights")
    if dt.autocast16:
        out.append(
            f"autocast over the {w.precision} weights (the HF Trainer's {w.precision}=True): peft's fp32 adapters "
            "keep 16-bit copies of their inputs; GPT-2's and GPT-NeoX's LayerNorms (and GPT-2's gelu_new) run in "
            "fp32 (measured: docs/calibration/h200_heldout19_a.jsonl, h200_heldout22_a.jsonl); vision models sized "
            "as without it"
        )
    elif w.training and w.precision in ("bf16", "fp16") and spec.kind == "lm":
        out.append(
            f"{w.precision} weights with no autocast (a plain training loop, torchtune); the HF Trainer's "
            f"{w.precision}=True (axolotl, LLaMA-Factory, TRL) runs autocast over them: give --autocast for it "
            "(measured as plain bf16: LoRA and QLoRA without checkpointing 16-24% over, GPT-2 15% under; "
            "docs/calibration/h200_heldout19_a.jsonl)"
        )
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
