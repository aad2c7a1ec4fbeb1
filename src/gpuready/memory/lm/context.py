"""Ctx, the job's context that every part of the language-model program reads: dtypes, tokens, what trains, the
attention kernel; which linears carry LoRA adapters.

Attention kernels are chosen as CUDA would (torch/backends/cuda, aten/.../sdp_utils.cpp): flash for 16-bit
without a mask (keeps q, k, v, out and the fp32 log-sum-exp), memory-efficient when a mask is needed or in fp32
without grouped-query heads, the math path otherwise (keeps the B·heads·S² probabilities).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuready.memory.dtypes import Dtypes, dtypes_for
from gpuready.memory.lm.moe import (
    EXPERT_MODULE_NAMES,
    NO_EXPERT_LORA,
    ExpertLora,
    converts_expert_targets,
    expert_lora,
)
from gpuready.models.lora import default_lora_targets
from gpuready.models.spec import Linear, ModelSpec
from gpuready.workload import Workload

# families whose layers follow Gemma-2's recorded program (four norms, the fp32 y kept for (1 + weight) * y): Gemma 3
# too, with its head norms (blocks_recorded.plain_block_forward, the recorded history h50_ft_gemma3_1b_b4)
GEMMA_NORMS = ("gemma2", "gemma3_text")
# Gemma 2 and 3 (transformers' Gemma2/Gemma3 model code): RMSNorm computed in fp32 with `* (1 + weight)`, four norms a
# decoder layer, the embedding scaled by sqrt(hidden) into a new tensor, a causal and a sliding-window mask
GEMMA_FAMILY = ("gemma2", "gemma3_text")


@dataclass(frozen=True)
class Ctx:
    spec: ModelSpec
    w: Workload
    dt: Dtypes
    tokens: int  # B*S in training / prefill
    full: bool  # full fine-tuning: block weights train
    lora: frozenset[str]  # linear names that carry a LoRA adapter
    backend: str  # attention kernel: flash, efficient, math, eager
    mask: bool  # an explicit attention mask is built (sliding window shorter than the sequence)
    shards: int = 1  # FSDP: parameters, gradients and optimizer states are split over this many GPUs
    expert_lora: ExpertLora = NO_EXPERT_LORA  # peft's adapters on the fused experts (lm/moe.py)


def lora_targets(spec: ModelSpec, w: Workload) -> frozenset[str]:
    if w.method == "full":
        return frozenset()
    names = {lin.name for lin in spec.block_linears if lin.count == 1}
    wanted = set(w.lora_targets or default_lora_targets(spec))
    # peft matches a target by the module name's last component; gpt2's two c_proj are both matched by c_proj
    hit = {n for n in names if n in wanted or n.split(".")[-1] in wanted}
    if converts_expert_targets(spec):
        # peft 0.21 moves these names onto the fused experts' parameters (memory/lm/moe.py): no nn.Linear of that
        # name is adapted, neither a dense layer's MLP nor a shared expert
        hit = {n for n in hit if n.split(".")[-1] not in EXPERT_MODULE_NAMES}
    return frozenset(hit)


def dense_lora(spec: ModelSpec, w: Workload) -> frozenset[str]:
    """The MLP linears peft adapts in the dense layers of an MoE model (Llama 4's interleaved Llama4TextMLP): the
    target names of the experts, where peft does not move them onto the fused experts (memory/lm/moe.py)."""
    if w.method == "full" or not w.training or not spec.dense_layers or converts_expert_targets(spec):
        return frozenset()
    wanted = {n.split(".")[-1] for n in (w.lora_targets or default_lora_targets(spec))}
    return frozenset(n for n in EXPERT_MODULE_NAMES if n in wanted)


def layer_kind(spec: ModelSpec, layer: int) -> tuple[bool, bool]:
    """What of a layer's index its program depends on: whether the layer is past an MoE model's dense layers
    (layer_linears, layer_lora, mlp_width and the layer functions read the index only through this comparison) and
    whether it attends through a sliding window (sliding_layer); memory/lm/memo.py writes out one layer's events for
    every layer of the same kind."""
    return layer >= spec.dense_layers, sliding_layer(spec, layer)


def layer_linears(spec: ModelSpec, layer: int) -> tuple[Linear, ...]:
    """The linears of this layer: an MoE model's dense layers (DeepSeek's leading first_k_dense_replace, Llama 4's
    layers between the MoE ones) have one MLP of intermediate_size in place of the experts and no shared expert."""
    if layer >= spec.dense_layers:
        return spec.block_linears
    out: list[Linear] = []
    for lin in spec.block_linears:
        if lin.name.startswith("shared_expert"):
            continue
        if lin.count > 1:
            h = spec.hidden
            i = spec.intermediate
            lin = Linear(lin.name, h if lin.in_features == h else i, h if lin.out_features == h else i, lin.bias, 1)
        out.append(lin)
    return tuple(out)


def layer_lora(ctx: Ctx, layer: int) -> frozenset[str]:
    """Names of this layer's linears that carry a LoRA adapter."""
    if layer < ctx.spec.dense_layers:
        return ctx.lora | dense_lora(ctx.spec, ctx.w)
    return ctx.lora


def experts_lora(spec: ModelSpec, w: Workload) -> ExpertLora:
    """peft's adapters on the fused experts of each MoE layer for this job (none for full fine-tuning)."""
    if w.method == "full" or not w.training:
        return NO_EXPERT_LORA
    return expert_lora(spec, set(w.lora_targets or default_lora_targets(spec)), w.lora_r)


def sliding_layer(spec: ModelSpec, layer: int) -> bool:
    """Whether `layer` attends through the sliding window: every layer of a model with a window on all of them
    (Mistral), else all but every p-th (Gemma 2 and gpt-oss alternate, p = 2; Gemma 3 has five sliding layers to a
    global one, p = 6: transformers' layer_types)."""
    if not spec.sliding_window or not spec.sliding_layers:
        return False
    if spec.sliding_layers >= spec.layers:
        return True
    period = spec.layers // (spec.layers - spec.sliding_layers)
    return (layer + 1) % period != 0


def masked_attention(backend: str, mask: bool, spec: ModelSpec, layer: int | None = None) -> bool:
    """Whether a layer's attention runs SDPA's memory-efficient kernel with a mask tensor (attention_backend's
    "efficient" with a mask: a sliding-window model past its window) on a sliding-window layer; a global layer has no
    mask (is_causal). `layer` None: the sliding layers as a group. The memory programs (the mask in the query's dtype,
    K/V repeated to every head) and the step time (plan/ops/lm.py: the masked kernel's rate) ask this."""
    if backend != "efficient" or not mask:
        return False
    return bool(spec.sliding_window and spec.sliding_layers) if layer is None else sliding_layer(spec, layer)


def attention_backend(spec: ModelSpec, w: Workload, dt: Dtypes, seq: int) -> tuple[str, bool]:
    """The kernel CUDA's SDPA dispatcher would pick for this job, and whether a mask tensor is built."""
    if w.attn == "eager" or spec.attn_sinks:  # gpt-oss: transformers has no SDPA path for attention sinks
        return "eager", True
    # transformers builds the mask once the sequence reaches the window (masking_utils._ignore_causal_mask_sdpa:
    # `kv_length < local_attention_size` to skip it); with a mask it repeats K/V (sdpa_attention.use_gqa_in_sdpa)
    mask = bool(spec.sliding_window and seq >= spec.sliding_window)
    gqa = spec.kv_heads < spec.heads and not spec.mla
    half = dt.act == 2
    if w.attn == "flash":
        return "flash", False
    if half and not mask and spec.head_dim <= 256:
        return "flash", False
    # memory-efficient attention supports masks and fp32 but not enable_gqa; with a mask transformers
    # repeats K/V to all heads itself (repeat_kv), so GQA does not block it there
    if mask or not gqa:
        return "efficient", mask
    return "math", False


def make_ctx(spec: ModelSpec, w: Workload) -> Ctx:
    dt = dtypes_for(w)
    tokens = w.batch * w.seq
    backend, mask = attention_backend(spec, w, dt, w.seq)
    shards = w.gpus if w.shard == "fsdp" else 1
    lora = lora_targets(spec, w)
    return Ctx(spec, w, dt, tokens, w.method == "full", lora, backend, mask, shards, experts_lora(spec, w))


def mlp_width(spec: ModelSpec, layer: int) -> tuple[int, int]:
    """(intermediate width per routed token, fan-out of each token) for this layer's MLP."""
    if spec.experts and layer >= spec.dense_layers:
        return spec.moe_intermediate, spec.experts_per_token
    return spec.intermediate, 1


def softmax_upcast_copy(ctx: Ctx) -> bool:
    """`softmax(x, dim, dtype=torch.float32)` on a bf16 input first makes an fp32 copy of it and then the fp32
    output; only fp16 on CUDA takes the fused half-to-float kernel (aten/src/ATen/native/SoftMax.cpp, `softmax`:
    `input_.is_cuda() && input_.scalar_type() == ScalarType::Half && dtype == ScalarType::Float`). Under bf16
    autocast the cast to fp32 is autocast's (softmax is on its fp32 list): the same copy."""
    return ctx.w.precision in ("bf16", "mixed")
