"""Mixture-of-experts layers as transformers 5.x and peft 0.21 run them, as programs of GPU allocations.

Two ways of running routed experts are modelled, each from the library's own code (transformers 5.17, the version
the H200 calibration runs used; 5.24 is the same for these paths):

- The experts interface (integrations/moe.py, `@use_experts_implementation`: Mixtral, Qwen2-MoE, Qwen3-MoE,
  DeepSeek-V2/V3, gpt-oss). `grouped_mm` is the default on a GPU (modeling_utils.get_correct_experts_implementation);
  generate() switches it to `batched_mm` for the decode steps (generation/utils._optimize_model_for_decode), which
  gathers every routed token's expert weights (`gate_up_proj[expert_ids]`, then `down_proj[expert_ids]`).
- Llama 4 (models/llama4/modeling_llama4.Llama4TextMoe): every expert runs on every token
  (`hidden_states.repeat(num_experts, 1)` scaled by the router's scores), two `torch.bmm` over all experts.

peft 0.21 (utils/transformers_weight_conversion._convert_peft_config_moe) rewrites a LoRA config for the model types
that transformers' conversion_mapping maps to "qwen2_moe" (Qwen3-MoE, DeepSeek-V2/V3): the target names
gate_proj, up_proj and down_proj are taken out of target_modules (so no nn.Linear of that name is adapted: not the
dense MLP layers, not the shared experts) and become target_parameters on the fused experts: gate_up_proj with rank
2r (alpha 2 alpha) and down_proj with rank r. Each is a lora.ParamWrapper whose adapter is (experts x rank) x in and
out x (experts x rank), in fp32 like every adapter. In forward it registers a parametrization (computing the full
W + B A once to check it, then freeing it) and then the experts read the parametrized weight: one full-size copy
per adapted parameter (torch.baddbmm, lora/layer._LoraFactorsProxy), kept by grouped_mm for backward, whose
gradient is as large again. The recorded H200 history of DeepSeek-V3 (4 layers) LoRA shows all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuready.models.spec import ModelSpec
from gpuready.workload import Workload

if TYPE_CHECKING:
    from gpuready.memory.lm.autograd import Layer
    from gpuready.memory.lm.context import Ctx
    from gpuready.memory.program import Program

# transformers conversion_mapping._MODEL_TO_CONVERSION_PATTERN: these model types convert like "qwen2_moe", whose
# entry in peft's _MOE_TARGET_MODULE_MAPPING moves gate_proj/up_proj/down_proj onto the fused expert parameters.
# qwen2_moe itself is not a key of that table, so peft leaves its config alone: its shared expert's linears are
# adapted and its experts are not (checked against peft on the meta device, tests/models/test_lora_params.py)
PEFT_FUSED_EXPERT_TYPES = ("qwen3_moe", "deepseek_v2", "deepseek_v3")
EXPERT_MODULE_NAMES = ("gate_proj", "up_proj", "down_proj")
# model types whose experts run through transformers' experts interface (grouped_mm; batched_mm while decoding)
EXPERTS_INTERFACE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")


@dataclass(frozen=True)
class ExpertLora:
    """peft's adapters on the fused experts of one MoE layer: the rank on gate_up_proj and on down_proj (0: none)."""

    gate_up_rank: int = 0
    down_rank: int = 0

    def __bool__(self) -> bool:
        return bool(self.gate_up_rank or self.down_rank)


NO_EXPERT_LORA = ExpertLora()


def converts_expert_targets(spec: ModelSpec) -> bool:
    return spec.model_type in PEFT_FUSED_EXPERT_TYPES and spec.experts > 0


def expert_lora(spec: ModelSpec, wanted: set[str], rank: int) -> ExpertLora:
    """The expert adapters peft 0.21 makes for these target names. gate_proj and up_proj are fused into
    gate_up_proj: peft adapts it (at twice the rank) only when both are named (it refuses one without the other)."""
    if not converts_expert_targets(spec):
        return ExpertLora()
    names = {n.split(".")[-1] for n in wanted}
    gate_up = 2 * rank if {"gate_proj", "up_proj"} <= names else 0
    return ExpertLora(gate_up, rank if "down_proj" in names else 0)


def expert_adapter_numels(spec: ModelSpec, lora: ExpertLora) -> list[int]:
    """Numels of one MoE layer's expert adapters, as peft allocates them: lora_A then lora_B per parameter."""
    h, i, n = spec.hidden, spec.moe_intermediate, spec.experts
    out: list[int] = []
    if lora.gate_up_rank:
        out += [n * lora.gate_up_rank * h, 2 * i * n * lora.gate_up_rank]
    if lora.down_rank:
        out += [n * lora.down_rank * i, h * n * lora.down_rank]
    return out


def expert_adapter_params(spec: ModelSpec, w: Workload, wanted: set[str]) -> int:
    """Trainable parameters peft adds on the fused experts of the whole model."""
    lora = expert_lora(spec, wanted, w.lora_r)
    return sum(expert_adapter_numels(spec, lora)) * (spec.layers - spec.dense_layers)


# Routers that cast their top-k weights back to the logits' dtype (`router_top_value.to(router_logits.dtype)`:
# Qwen2MoeTopKRouter, Qwen3MoeTopKRouter): the experts' routing-weight product, its reordered copy and the sum over
# the k experts stay in 16 bits (the recorded history h44_gen_qwen3_30b_b16: three 512 MiB bf16 tensors at the
# prefill's peak, where fp32 made qwen3-30b-a3b generation +1.6% allocated). Mixtral's and DeepSeek's routers hand
# over fp32 weights, and the product is fp32 (DeepSeek-V3's history).
SIXTEEN_BIT_ROUTING = ("qwen2_moe", "qwen3_moe")


def expert_bytes(ctx: Ctx) -> int:
    """Bytes per element of the routed experts' tensors: the activations' dtype, but fp32 under autocast over fp32
    weights, where torch._grouped_mm is on no autocast list and runs on the fp32 norm output with the fp32 expert
    weights (the recorded history h50_lora_qwen15moe_mixed_b2: 88 MiB gate_up outputs at 2 x 1024 tokens x 4
    experts, Qwen1.5-MoE LoRA -3.3% allocated with them in bf16)."""
    return 4 if ctx.dt.autocast else ctx.dt.act


def routing_bytes(ctx: Ctx) -> int:
    """Bytes per element of the routing-weight product and the sum over the k experts."""
    return expert_bytes(ctx) if ctx.spec.model_type in SIXTEEN_BIT_ROUTING else 4


def _sizes(ctx: Ctx, tokens: int) -> tuple[int, int, int, int, int, int]:
    spec = ctx.spec
    e = expert_bytes(ctx)
    return tokens * spec.experts_per_token, spec.hidden, spec.moe_intermediate, spec.experts, e, ctx.dt.param


def grouped_experts_forward(layer_: Layer, ctx: Ctx, lora: ExpertLora) -> int:
    """The routed experts under autograd (grouped_mm_experts_forward), T tokens each sent to k experts (S = T k
    rows): DeepSeek's router casts the input to fp32; the rows gathered in expert order (kept when the expert
    weights need a gradient); the gate_up grouped_mm and its masked_fill copy (kept: the activation and the
    product read it); silu(gate) (kept by the product); the product (kept when down_proj's weight needs a
    gradient); the down grouped_mm and its masked copy (kept by the routing-weight product); that product in fp32,
    reordered, summed over the k experts in fp32 and cast back. Under peft's expert LoRA each adapted weight is
    first built and freed (register_parametrization's check), then built again when the experts read it and kept
    for backward, where its gradient is as large. Returns the output's handle (a temporary of the layer)."""
    prog, spec = layer_.prog, ctx.spec
    S, h, i, n, e, p = _sizes(ctx, ctx.tokens)
    T = ctx.tokens
    save, tmp, drop = layer_.save, layer_.tmp, layer_.drop
    full = ctx.full
    gu_w, down_w = n * 2 * i * h * p, n * h * i * p
    if spec.model_type == "deepseek_v3":
        # DeepseekV3TopkRouter: F.linear(hidden_states.type(torch.float32), weight.float()); kept when it trains
        if full:
            save(T * h * 4)
        else:
            prog.transient("activations", T * h * 4)
    # peft's get_delta_factors: lora_B and lora_A cast to the expert weights' dtype (no copy when that is fp32),
    # made when the parametrization is first checked and kept by baddbmm for backward; the check builds W + B A
    # (with B's contiguous copy) and frees it (h55_qlora_deepseekv2lite_b2: 4 + 2.75 MiB for down_proj, 11 + 8 MiB
    # for gate_up_proj a layer, kept to the backward)
    down_b, gu_b = h * n * lora.down_rank * p, 2 * i * n * lora.gate_up_rank * p

    def factors_and_check(rank: int, fan_in: int, b_bytes: int, weight: int) -> None:
        if p != 4:
            save(b_bytes, b_bytes)
            save(n * rank * fan_in * p, n * rank * fan_in * p)
        check = prog.alloc("activations", weight)
        prog.transient("activations", b_bytes)
        prog.free(check)

    if lora.down_rank:  # the outer ParamWrapper's parametrization first
        factors_and_check(lora.down_rank, i, down_b, down_w)
    if lora.gate_up_rank:
        factors_and_check(lora.gate_up_rank, h, gu_b, gu_w)
    gu_trains = full or bool(lora.gate_up_rank)
    down_trains = full or bool(lora.down_rank)
    temps: list[int] = []
    if gu_trains:
        save(S * h * e)  # hidden_states[perm // k]
    else:
        temps.append(tmp(S * h * e))
    if lora.gate_up_rank:
        save(gu_w, 0, (), (gu_w,))  # W + B A, kept by grouped_mm; its gradient in backward
        prog.transient("activations", gu_b)
    elif full:
        layer_.weight_grad(gu_w)
    first = tmp(S * 2 * i * e)
    save(S * 2 * i * e, S * 2 * i * e)  # masked_fill (out of place): gate and up are its chunks
    drop(first)
    save(S * i * e, S * i * e, (), (S * i * e,))  # silu(gate), kept by the product
    if down_trains:
        save(S * i * e, S * i * e)  # the product, down_proj's input
        prod = 0
    else:
        prod = tmp(S * i * e)
    if lora.down_rank:
        save(down_w, 0, (), (down_w,))
        prog.transient("activations", down_b)
    elif full:
        layer_.weight_grad(down_w)
    first = tmp(S * h * e)
    if prod:
        drop(prod)
    r = routing_bytes(ctx)
    save(S * h * e, S * h * e, (), (S * h * r, S * h * r))  # masked down output, kept by * routing weights
    drop(first)
    weighted = tmp(S * h * r)  # proj_out * sample_weights
    reordered = tmp(S * h * r)  # weighted_out[inv_perm]
    drop(weighted)
    summed = tmp(T * h * r)  # .view(T, k, h).sum(dim=1)
    out = tmp(T * h * e) if r != e else summed  # .to(hidden_states.dtype)
    drop(reordered)
    if out != summed:
        drop(summed)
    for handle in temps:
        drop(handle)
    return out


def grouped_experts_nograd(prog: Program, ctx: Ctx, tokens: int) -> int:
    """grouped_mm_experts_forward without autograd (prefill; the recorded history of DeepSeek-V3 generation):
    tensors go when Python drops them; the gathered rows, the masked down output and the reordered fp32 product
    live until the function returns. Returns the output's handle."""
    S, h, i, _n, e, _p = _sizes(ctx, tokens)
    alloc, free = prog.alloc, prog.free
    if ctx.spec.model_type == "deepseek_v3":
        prog.transient("activations", tokens * h * 4)  # the router's fp32 input
    sel = alloc("activations", S * h * e)
    gu = alloc("activations", S * 2 * i * e)
    masked = alloc("activations", S * 2 * i * e)
    free(gu)
    act = alloc("activations", S * i * e)
    prod = alloc("activations", S * i * e)
    free(act)
    free(masked)
    down = alloc("activations", S * h * e)
    free(prod)
    masked = alloc("activations", S * h * e)
    free(down)
    r = routing_bytes(ctx)
    weighted = alloc("activations", S * h * r)
    reordered = alloc("activations", S * h * r)
    free(weighted)
    summed = alloc("activations", tokens * h * r)
    out = alloc("activations", tokens * h * e) if r != e else summed
    prog.free_all([sel, masked, reordered] + ([summed] if out != summed else []))
    return out


def batched_experts_decode(prog: Program, ctx: Ctx, tokens: int) -> int:
    """batched_mm_experts_forward, which generate() uses for the decode steps: each of the S = tokens x k rows gets
    its own copy of its expert's gate_up weights (`gate_up_proj[expert_ids]`), then of its down weights while the
    first copy is still referenced (the recorded history of DeepSeek-V3 generation: 1.75 GiB and 0.88 GiB per
    step for 4 sequences). Returns the output's handle."""
    S, h, i, _n, e, p = _sizes(ctx, tokens)
    alloc, free = prog.alloc, prog.free
    if ctx.spec.model_type == "deepseek_v3":
        prog.transient("activations", tokens * h * 4)
    sel = alloc("activations", S * h * e)  # repeat_interleave
    gu_w = alloc("activations", S * 2 * i * h * p)
    gu = alloc("activations", S * 2 * i * e)
    act = alloc("activations", S * i * e)
    prod = alloc("activations", S * i * e)
    free(act)
    free(gu)
    down_w = alloc("activations", S * h * i * p)
    free(gu_w)
    down = alloc("activations", S * h * e)
    free(prod)
    r = routing_bytes(ctx)
    weighted = alloc("activations", S * h * r)
    summed = alloc("activations", tokens * h * r)
    out = alloc("activations", tokens * h * e) if r != e else summed
    prog.free_all([sel, down_w, down, weighted] + ([summed] if out != summed else []))
    return out


def llama4_experts_forward(layer_: Layer, ctx: Ctx) -> tuple[int, list[int]]:
    """Llama4TextMoe's routed part under autograd, as the recorded H200 history of Llama-4 Scout (2 layers) LoRA
    shows it, with E experts each run on all T tokens: the repeated input (kept: its product with the router's
    scores needs it for the scores' gradient), that product (kept when the expert weights train), the gate_up bmm
    (kept: the activation and the product read its chunks), silu(gate) (kept by the product), the product (kept
    when down_proj trains), the down bmm. Backward makes gradients of the same sizes, the gate_up one
    (2 x intermediate) at once. Returns the routed output's handle and the temporaries that go when the MoE
    returns (the caller sums the output over the experts first)."""
    spec, e, p = ctx.spec, ctx.dt.act, ctx.dt.param
    ET, h, i = spec.experts * ctx.tokens, spec.hidden, spec.moe_intermediate
    save, tmp = layer_.save, layer_.tmp
    full = ctx.full
    ends: list[int] = []
    save(ET * h * e, ctx.tokens * h * e)  # hidden_states.repeat(E, 1)
    if full:
        save(ET * h * e, ET * h * e, (h * 2 * i * spec.experts * p,))  # routed_in, kept by the bmm
    else:
        ends.append(tmp(ET * h * e))  # routed_in: the bmm with frozen weights keeps nothing
        layer_.grad_node(ET * h * e)  # the gate_up bmm's input gradient
    save(ET * 2 * i * e, ET * 2 * i * e)  # gate_up; gate and up are its chunks
    save(ET * i * e, ET * i * e, (), (ET * i * e,))  # silu(gate), kept by the product
    if full:
        save(ET * i * e, ET * i * e, (i * h * spec.experts * p,))  # up * act, down's input
        prod = 0
    else:
        prod = tmp(ET * i * e)
        layer_.grad_node(ET * i * e)  # the down bmm's input gradient
    out = tmp(ET * h * e)
    if prod:
        layer_.drop(prod)
    layer_.grad_node(ET * h * e)  # the sum over experts hands each expert's rows their gradient
    return out, ends


def llama4_experts_nograd(prog: Program, ctx: Ctx, tokens: int) -> tuple[int, list[int]]:
    """Llama4TextMoe's routed part without autograd (the recorded history of Llama-4 Scout prefill): the repeated
    input, its product with the scores (alive until the MoE returns), gate_up (E x T x 2 intermediate), silu(gate),
    the product, the down bmm. Returns the routed output's handle and what the caller frees when the MoE
    returns."""
    spec, e = ctx.spec, ctx.dt.act
    ET, h, i = spec.experts * tokens, spec.hidden, spec.moe_intermediate
    alloc, free = prog.alloc, prog.free
    rep = alloc("activations", ET * h * e)
    routed = alloc("activations", ET * h * e)
    free(rep)
    gu = alloc("activations", ET * 2 * i * e)
    act = alloc("activations", ET * i * e)
    prod = alloc("activations", ET * i * e)
    free(act)
    out = alloc("activations", ET * h * e)
    free(prod)
    free(gu)
    return out, [routed]
