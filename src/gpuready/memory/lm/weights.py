"""The model's parameters as from_config allocates them on the GPU (and FSDP2's sharding of them)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuready.memory.lm import nf4
from gpuready.memory.lm.context import Ctx, layer_linears, layer_lora
from gpuready.memory.lm.moe import expert_adapter_numels
from gpuready.memory.optimizer import Trainable
from gpuready.memory.program import Program
from gpuready.models.spec import Linear


def _linear_weight_bytes(ctx: Ctx, lin: Linear) -> int:
    """A linear weight's bytes on the GPU: QLoRA's NF4 codes with their double-quantized state (about 4.127 bits
    a parameter, Dettmers et al. 2023, QLoRA, section 3; nf4.kept_bytes), else the parameter dtype's. An MoE
    layer's routed experts (count > 1) stay in the parameter dtype under QLoRA too: transformers 5 keeps them as
    fused 3-D parameters, not nn.Linear modules, and bitsandbytes' 4-bit conversion replaces nn.Linear modules only
    (bitsandbytes issue #1849, open as of 2026-12)."""
    n = lin.in_features * lin.out_features * lin.count
    if ctx.w.method == "qlora" and lin.count == 1:
        return nf4.kept_bytes(n)
    return n * ctx.dt.param


def _fused_experts(lins: tuple[Linear, ...]) -> list[Linear]:
    """transformers 5 stores an MoE layer's expert gate and up projections as one parameter, gate_up_proj
    (experts x 2 intermediate x hidden, and one gate_up_proj_bias where there are biases): one tensor, one
    allocation (the recorded histories of Llama-4 Scout and DeepSeek-V3: one segment of both)."""
    by_name = {lin.name: lin for lin in lins}
    gate, up = by_name.get("gate_proj"), by_name.get("up_proj")
    if gate is None or up is None or gate.count == 1 or up.count == 1:
        return list(lins)
    fused = Linear("gate_up_proj", gate.in_features, gate.out_features + up.out_features, gate.bias, gate.count)
    return [fused if lin is gate else lin for lin in lins if lin is not up]


def _construction_order(model_type: str, lins: list[Linear]) -> list[Linear]:
    """The linears in the order the model's modules construct them: transformers' Phi3Attention makes o_proj before
    qkv_proj (h54_qlora_phi4_ckpt_b2_s4096: the 50 MiB o_proj weight comes second, before the 75 MiB qkv_proj)."""
    if model_type != "phi3":
        return lins
    return sorted(lins, key=lambda lin: lin.name != "o_proj")  # (stable: the rest keep their order)


@dataclass
class Weights:
    trainable: list[Trainable]  # per GPU (FSDP: the shards)
    cast_bytes: int  # bytes of linear weights that autocast casts to bf16 each step
    # FSDP units, each a list of its parameters' full sizes in bytes: one per decoder layer, then the root
    # (embeddings, final norm, lm_head)
    units: list[list[int]]


def load_weights(prog: Program, ctx: Ctx, whole_first: bool = True) -> Weights:
    """Allocate every parameter as from_config builds it on the GPU. Under FSDP the whole model is built on
    each GPU first (as the calibration runs and the trial's probe do) and then sharded unit by unit:
    fully_shard(layer) for every layer, then fully_shard(model) (the recorded H200 history of
    fsdp2_llama8b: each unit's shards are allocated, then its full parameters freed; their blocks stay cached).
    With whole_first=False (a model initialised on the meta device) only the shards are allocated."""
    spec, p = ctx.spec, ctx.dt.param
    trainable: list[Trainable] = []
    h = spec.hidden
    n = ctx.shards
    units: list[list[int]] = [[] for _ in range(spec.layers + 1)]
    handles: list[list[int]] = [[] for _ in range(spec.layers + 1)]
    unit = spec.layers  # the root until the first layer

    meta = n > 1 and not whole_first
    # peft adds the adapters after from_config has built the whole model (get_peft_model), so on one GPU their
    # allocations come after every weight: each adapter moved to its base layer's device in the base weights'
    # dtype (tuners_utils._move_adapter_to_device_of_base_layer), lora_A then lora_B module by module, then each
    # cast to fp32 in the same order (cast_adapter_dtype: the fp32 copy made, the moved one freed). The recorded
    # H200 history lora_qwen7b_s2048_b3_cap80 shows both passes after the last weight (benchmarks/allocator_check.py
    # --job); QLoRA's (qlora_llama8b_b1_s2048) the same. Under FSDP the adapters stay where the parameters are built
    # (not recorded).
    deferred: list[int] = []  # the adapters' numels, in peft's order
    small: list[tuple[int, int]] = []  # --kbit-prep: the parameters that are not 4-bit (handle, numel), in order
    defer = n == 1 and ctx.w.method in ("lora", "qlora")
    # QLoRA's base model as from_pretrained with bitsandbytes loads it: each linear weight made in the parameter
    # dtype and quantized at once (nf4.load); the output head is tied before any weight is made (no spare head)
    quantize = n == 1 and ctx.w.method == "qlora"

    def param(nbytes: int, numel: int, trains: bool, cat: str = "weights", shape: tuple[int, ...] = ()) -> None:
        """One parameter tensor (`shape` where known: the optimizer's states may depend on it)."""
        units[unit].append(nbytes)
        if defer and cat == "lora_adapters":
            deferred.append(numel)
            trainable.append(Trainable(numel, 2 if ctx.dt.lora16 else 4, shape))
            return
        handles[unit].append(prog.alloc(cat, -(-nbytes // n) if meta else nbytes))
        if cat == "weights" and ctx.w.kbit_prep:
            small.append((handles[unit][-1], numel))
        if trains:
            # FSDP keeps 1/n of every parameter (a DTensor shard) on each GPU (its shape not tracked)
            trainable.append(Trainable(-(-numel // n), p if cat == "weights" else 4, shape if n == 1 else ()))

    param(spec.vocab * h * p, spec.vocab * h, ctx.full, shape=(spec.vocab, h))
    if spec.learned_positions:
        param(spec.learned_positions * h * p, spec.learned_positions * h, ctx.full, shape=(spec.learned_positions, h))
    norm_numel = h * (2 if spec.norm == "layer" else 1)
    cast_bytes = 0
    for layer in range(spec.layers):
        unit = layer
        dense = layer < spec.dense_layers
        adapted = layer_lora(ctx, layer)
        for lin in _construction_order(spec.model_type, _fused_experts(layer_linears(spec, layer))):
            numel = lin.in_features * lin.out_features * lin.count
            if quantize and lin.count == 1:  # (an MoE layer's fused experts are not quantized: _linear_weight_bytes)
                units[unit].append(_linear_weight_bytes(ctx, lin))
                nf4.load(prog, numel, p)
            else:
                shape: tuple[int, ...] = (lin.out_features, lin.in_features)
                shape = (lin.count, *shape) if lin.count > 1 else shape
                param(_linear_weight_bytes(ctx, lin), numel, ctx.full, shape=shape)
            cast_bytes += numel * 2
            if lin.bias:
                bias = (lin.count, lin.out_features) if lin.count > 1 else (lin.out_features,)
                param(lin.out_features * lin.count * p, lin.out_features * lin.count, ctx.full, shape=bias)
            if lin.name in adapted:
                r = ctx.w.lora_r
                # peft creates adapters in fp32 (get_peft_model(autocast_adapter_dtype=True), peft >= 0.12)
                param(r * lin.in_features * 4, r * lin.in_features, True, "lora_adapters", (r, lin.in_features))
                param(lin.out_features * r * 4, lin.out_features * r, True, "lora_adapters", (lin.out_features, r))
        if spec.experts and not dense:
            param(h * spec.experts * p, h * spec.experts, ctx.full, shape=(spec.experts, h))  # router
            for numel in expert_adapter_numels(spec, ctx.expert_lora):  # fp32, as peft casts every adapter
                param(numel * 4, numel, True, "lora_adapters")
        for _ in range(spec.norms_per_layer):
            param(norm_numel * p, norm_numel, ctx.full, shape=(norm_numel,))
        if spec.qk_norm:
            param(2 * spec.head_dim * p, 2 * spec.head_dim, ctx.full, shape=(2 * spec.head_dim,))
        if spec.mla:
            param(spec.kv_lora_rank * p, spec.kv_lora_rank, ctx.full, shape=(spec.kv_lora_rank,))
        for numel in spec.layer_extra_params:  # sinks, router bias, q_a_layernorm
            param(numel * p, numel, ctx.full)
    unit = spec.layers
    param(norm_numel * p, norm_numel, ctx.full, shape=(norm_numel,))
    if not spec.tied:
        param(spec.vocab * h * p, spec.vocab * h, ctx.full, shape=(spec.vocab, h))
    elif not quantize:
        # from_config builds lm_head with its own weight, then tie_weights() points it at the embedding and the
        # built one is freed: its block stays cached (every tied model's recorded H200 history shows it)
        prog.free(prog.alloc("weights", -(-spec.vocab * h * p // n) if meta else spec.vocab * h * p))
    # peft's prepare_model_for_kbit_training, before the adapters: every 16-bit parameter that is not 4-bit cast to
    # fp32 in the model's parameter order (the fp32 copy made, the 16-bit one freed; history kbit_prep_3)
    for handle, numel in small:
        prog.alloc("weights", numel * 4)
        prog.free(handle)
    if small:
        # and then torch.cuda.empty_cache() (peft's auto_clear_cache, on by default: the GPU gives its wholly free
        # segments back there; histories kbit_prep_1..4, kbit_mistral_ckpt_b2)
        prog.empty_cache()
    moved = [prog.alloc("lora_adapters", numel * p) for numel in deferred]
    if p != 4:
        cast: list[int] = []
        for handle, numel in zip(moved, deferred, strict=True):
            cast.append(prog.alloc("lora_adapters", numel * 4))
            prog.free(handle)
        if ctx.dt.lora16:
            # TRL's SFTTrainer then casts every trainable parameter of a 4-bit model to bf16 (param.data =
            # param.data.to(bf16)), in the same order (recorded: trl_qlora_llama8b_b1)
            for handle, numel in zip(cast, deferred, strict=True):
                prog.alloc("lora_adapters", numel * 2)
                prog.free(handle)
    if n > 1 and not meta:
        for sizes, full in zip(units, handles, strict=True):
            for nbytes in sizes:
                prog.alloc("weights", -(-nbytes // n))
            prog.free_all(full)
    return Weights(trainable, cast_bytes, units)
