"""Language models (Hugging Face transformers, decoder-only) as a program of GPU allocations.

What each op keeps for backward follows PyTorch autograd's formulas (tools/autograd/derivatives.yaml: an input
is saved only when the *other* operand needs its gradient, e.g. a frozen linear does not keep its input) and the
model code in transformers (modeling_llama.py and relatives; loss_utils.ForCausalLMLoss upcasts logits to fp32).
Attention kernels are chosen as CUDA would (torch/backends/cuda, aten/.../sdp_utils.cpp): flash for 16-bit
without a mask (keeps q, k, v, out and the fp32 log-sum-exp), memory-efficient when a mask is needed or in fp32
without grouped-query heads, the math path otherwise (keeps the B·heads·S² probabilities).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuready.memory.ddp import DdpBuckets
from gpuready.memory.dtypes import Dtypes, dtypes_for
from gpuready.memory.optimizer import Trainable, optimizer_step
from gpuready.memory.program import Program
from gpuready.models.spec import Linear, ModelSpec
from gpuready.workload import Workload

# QLoRA: NF4 weights are 4 bits; double quantization stores 8-bit absmax per 64 weights plus an fp32 per 256
# blocks: 8/64 + 32/(64*256) = 0.127 bits/param (Dettmers et al. 2023, QLoRA, section 3).
NF4_BYTES_PER_PARAM = 0.5 + 0.127 / 8

# PyTorch takes cuBLAS workspaces from the caching allocator, one per (handle, stream), kept for the process;
# 32 MiB each on Hopper (CUBLAS_WORKSPACE_CONFIG default :4096:8, aten/src/ATen/cuda/CublasHandlePool.cpp)
CUBLAS_WORKSPACE_BYTES = 32 * 1024**2

# Optimizer steps simulated. The first creates the optimizer states, the second runs with them and sets the
# peak; the calibration runs made three, and simulating the third changes none of the 35 measured rows.
STEPS = 2
# Decode steps replayed one token at a time; the rest of a longer generation is replayed in DECODE_COARSE steps of
# several tokens each, so any --new-tokens costs at most DECODE_EXACT + DECODE_COARSE steps (docs/estimator.md
# gives the error against token-by-token replay)
DECODE_EXACT = 256
DECODE_COARSE = 128


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


def default_lora_targets(spec: ModelSpec) -> list[str]:
    """docs/cli.md's default for --lora-targets: every linear layer of the blocks, named as peft matches them (by
    the module name's last part): q,k,v,o,gate,up,down_proj for llama/qwen/mistral/gemma; the fused qkv_proj and
    gate_up_proj for phi-3; c_attn, c_proj, c_fc for gpt2. The trial and the traced mode use the same list."""
    return list(dict.fromkeys(lin.name.split(".")[-1] for lin in spec.block_linears))


def lora_targets(spec: ModelSpec, w: Workload) -> frozenset[str]:
    if w.method == "full":
        return frozenset()
    names = {lin.name for lin in spec.block_linears if lin.count == 1}
    wanted = set(w.lora_targets or default_lora_targets(spec))
    # peft matches a target by the module name's last component; gpt2's two c_proj are both matched by c_proj
    hit = {n for n in names if n in wanted or n.split(".")[-1] in wanted}
    return frozenset(hit)


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
    return Ctx(spec, w, dt, tokens, w.method == "full", lora_targets(spec, w), backend, mask, shards)


# ---------------------------------------------------------------------------------------------- weights
def _linear_weight_bytes(ctx: Ctx, lin: Linear) -> int:
    n = lin.in_features * lin.out_features * lin.count
    if ctx.w.method == "qlora":
        return int(n * NF4_BYTES_PER_PARAM)
    return n * ctx.dt.param


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

    def param(nbytes: int, numel: int, trains: bool, cat: str = "weights") -> None:
        handles[unit].append(prog.alloc(cat, -(-nbytes // n) if meta else nbytes))
        units[unit].append(nbytes)
        if trains:
            # FSDP keeps 1/n of every parameter (a DTensor shard) on each GPU
            trainable.append(Trainable(-(-numel // n), p if cat == "weights" else 4))

    param(spec.vocab * h * p, spec.vocab * h, ctx.full)
    if spec.learned_positions:
        param(spec.learned_positions * h * p, spec.learned_positions * h, ctx.full)
    norm_numel = h * (2 if spec.norm == "layer" else 1)
    cast_bytes = 0
    for layer in range(spec.layers):
        unit = layer
        dense = layer < spec.dense_layers
        for lin in spec.block_linears:
            if dense and lin.count > 1:
                # deepseek's leading dense layers: one MLP of intermediate_size instead of the experts
                lin = Linear(
                    lin.name,
                    lin.in_features if lin.in_features == h else spec.intermediate,
                    spec.intermediate if lin.out_features != h else h,
                    lin.bias,
                    1,
                )
            if dense and lin.name.startswith("shared_expert"):
                continue
            numel = lin.in_features * lin.out_features * lin.count
            param(_linear_weight_bytes(ctx, lin), numel, ctx.full)
            cast_bytes += numel * 2
            if lin.bias:
                param(lin.out_features * lin.count * p, lin.out_features * lin.count, ctx.full)
            if lin.name in ctx.lora:
                r = ctx.w.lora_r
                # peft creates adapters in fp32 (get_peft_model(autocast_adapter_dtype=True), peft >= 0.12)
                param(r * lin.in_features * 4, r * lin.in_features, True, "lora_adapters")
                param(lin.out_features * r * 4, lin.out_features * r, True, "lora_adapters")
        if spec.experts and not dense:
            param(h * spec.experts * p, h * spec.experts, ctx.full)  # router
        for _ in range(spec.norms_per_layer):
            param(norm_numel * p, norm_numel, ctx.full)
        if spec.qk_norm:
            param(2 * spec.head_dim * p, 2 * spec.head_dim, ctx.full)
        if spec.mla:
            param(spec.kv_lora_rank * p, spec.kv_lora_rank, ctx.full)
        for numel in spec.layer_extra_params:  # sinks, router bias, q_a_layernorm
            param(numel * p, numel, ctx.full)
    unit = spec.layers
    param(norm_numel * p, norm_numel, ctx.full)
    if not spec.tied:
        param(spec.vocab * h * p, spec.vocab * h, ctx.full)
    else:
        # from_config builds lm_head with its own weight, then tie_weights() points it at the embedding and the
        # built one is freed: its block stays cached (every tied model's recorded H200 history shows it)
        prog.free(prog.alloc("weights", -(-spec.vocab * h * p // n) if meta else spec.vocab * h * p))
    if n > 1 and not meta:
        for sizes, full in zip(units, handles, strict=True):
            for nbytes in sizes:
                prog.alloc("weights", -(-nbytes // n))
            prog.free_all(full)
    return Weights(trainable, cast_bytes, units)


# ---------------------------------------------------------------------------------------------- one block
# families whose norms follow Gemma-2's recorded program (the fp32 y kept for (1 + weight) * y). Gemma3RMSNorm is
# the same code, but with it the program put Gemma-3 +3.7% (allocated) over the H200 and the traced mode, without
# it -0.3% (docs/accuracy.md): another part of the generic layer over-counts Gemma-3 by about as much (not found)
GEMMA_NORMS = ("gemma2",)
NOTHING_KEPT = 0  # a backward node that keeps no tensor of its own (Program handle 0 is "nothing")


@dataclass
class Saved:
    handle: int
    grad_bytes: int  # the gradient backward produces at this node (activation-sized)
    param_grads: tuple[int, ...] = ()  # weight gradients allocated at this node
    transient: tuple[int, ...] = ()  # scratch tensors this node's backward allocates together and frees


class _Layer:
    """One layer's forward bookkeeping: what it keeps for backward (`saved`, in order) or, without autograd
    (keep=False: no_grad, or the first pass of a checkpointed layer), the same tensors as temporaries; temporaries
    are freed when the layer ends."""

    def __init__(self, prog: Program, keep: bool) -> None:
        self.prog = prog
        self.keep = keep
        self.saved: list[Saved] = []
        self.temps: list[int] = []

    def alloc(self, nbytes: int) -> int:
        return self.prog.alloc("activations", nbytes)

    def keep_handle(
        self, handle: int, grad: int = 0, pgrads: tuple[int, ...] = (), transient: tuple[int, ...] = ()
    ) -> None:
        if self.keep:
            self.saved.append(Saved(handle, grad, pgrads, transient))
        else:
            self.temps.append(handle)

    def save(self, nbytes: int, grad: int = 0, pgrads: tuple[int, ...] = (), transient: tuple[int, ...] = ()) -> None:
        self.keep_handle(self.alloc(nbytes), grad, pgrads, transient)

    def tmp(self, nbytes: int) -> int:
        handle = self.alloc(nbytes)
        self.temps.append(handle)
        return handle

    def drop(self, handle: int) -> None:
        self.temps.remove(handle)
        self.prog.free(handle)

    def weight_grad(self, nbytes: int) -> None:
        """A node that keeps nothing of its own but makes a weight's gradient in backward."""
        if self.keep:
            self.saved.append(Saved(NOTHING_KEPT, 0, (nbytes,)))

    def finish(self) -> list[Saved]:
        for handle in self.temps:
            self.prog.free(handle)
        self.temps = []
        return self.saved


def _mlp_width(spec: ModelSpec, layer: int) -> tuple[int, int]:
    """(intermediate width per routed token, fan-out of each token) for this layer's MLP."""
    if spec.experts and layer >= spec.dense_layers:
        return spec.moe_intermediate, spec.experts_per_token
    return spec.intermediate, 1


def _recorded_layer_order(ctx: Ctx, layer: int) -> bool:
    """Whether this layer's forward can follow the order recorded on the GPU (_plain_block_forward): a plain
    decoder layer (RMSNorm, separate or fused q/k/v, gated MLP, flash, memory-efficient or fp32 math attention
    without repeated K/V) trained in 16 bits (full or LoRA) or fp32 (full); Gemma-2's four norms in 16 bits."""
    spec, lins = ctx.spec, {lin.name for lin in ctx.spec.block_linears}
    attn = {"q_proj", "k_proj", "v_proj"} <= lins or "qkv_proj" in lins
    mlp = {"gate_proj", "up_proj"} <= lins or "gate_up_proj" in lins
    expanded = ctx.backend == "efficient" and ctx.mask and spec.kv_heads < spec.heads
    return (
        ctx.w.method in ("lora", "full")
        and (ctx.dt.act == 2 or (ctx.dt.act == 4 and ctx.full))
        and not ctx.dt.autocast
        and spec.norm == "rms"
        and (spec.norms_per_layer == 2 or (spec.model_type in GEMMA_NORMS and spec.norms_per_layer == 4))
        and spec.gated_mlp
        and not spec.mla
        and not spec.shared_intermediate
        and not (spec.experts and layer >= spec.dense_layers)
        and spec.model_type != "gpt2"
        and not (spec.model_type in GEMMA_NORMS and ctx.dt.act == 4)
        and (ctx.backend in ("flash", "efficient") or (ctx.backend == "math" and ctx.dt.act == 4))
        and not expanded
        and attn
        and mlp
        and "o_proj" in lins
        and "down_proj" in lins
    )


def _plain_block_forward(prog: Program, ctx: Ctx, layer: int, keep: bool) -> list[Saved]:
    """A plain decoder layer's forward (16-bit full or LoRA, fp32 full) in the order the recorded H200 histories
    show it (docs/calibration/histories: lora_llama8b_b1 for LoRA, ft_qwen15_bf16 for 16-bit and ft_qwen05_fp32
    for fp32 full fine-tuning). Under full fine-tuning the norm outputs, the attention output and the MLP product
    are kept for the weight gradients; in fp32 the residual stream is kept too (the next norm's pow keeps its input,
    no fp32 copy being made). Under LoRA, per adapted linear as peft's lora.Linear.forward runs it:
    the base output; x cast to fp32 (kept by lora_A); lora_A's output (kept by lora_B); lora_B's output, times the
    scaling, plus the base output, in fp32, each freeing the one before; the sum cast back (the linear's output).
    Attention keeps the RoPE'd q and k, v (the v projection's own output, or the whole fused qkv output it is a
    view of), its output and log-sum-exp; the norm's output lives until the attention or MLP returns."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, a, kv, d = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    e, r, rank = dt.act, dt.resid, ctx.w.lora_r
    full = ctx.full
    fp32 = e == 4
    all_lins = {lin.name: lin for lin in spec.block_linears}
    lins = set(all_lins)
    layer_ = _Layer(prog, keep)
    alloc, save, save_handle = layer_.alloc, layer_.save, layer_.keep_handle

    def norm() -> int:
        """The norm's output handle: a temporary under LoRA; under full fine-tuning it is kept (by the
        projections that read it, whose weights train) and 0 is returned."""
        if fp32:
            # x.to(fp32) is x itself: the residual stream, kept by pow (the residual adds below are saved)
            prog.free(alloc(T * h * 4))  # x ** 2
            save(T * h * 4, T * h * e, transient=(T * h * 4,) * 3)  # x * rsqrt, kept by weight * y
            save(T * h * 4)  # weight * y, kept by the projections
            return 0
        save(T * h * 4, T * h * e, transient=(T * h * 4,) * 3)  # x.to(fp32), kept by pow
        prog.free(alloc(T * h * 4))  # x ** 2
        y32 = alloc(T * h * 4)  # x * rsqrt
        if full:
            save(T * h * r)  # .to(dtype), kept by weight * y since the weight trains
            save(T * h * r)  # weight * y, kept by the projections
            prog.free(y32)
            return 0
        yb = alloc(T * h * r)  # .to(dtype)
        out = alloc(T * h * r)  # weight * y
        prog.free(y32)
        prog.free(yb)
        return out

    def gemma_norm(src: int = 0, feeds_linears: bool = False) -> int:
        """Gemma2RMSNorm as the recorded histories of gemma-2-2b (LoRA and full fine-tuning) show it: x.float()
        (kept by pow), pow, x * rsqrt (kept when the weight trains), * (1 + weight) in fp32, .type_as(x) (the
        output, kept under full fine-tuning when linears read it). `src` (a projection's output) is freed once the
        norm is done."""
        save(T * h * 4, T * h * e, transient=(T * h * 4,) * 3)
        prog.free(alloc(T * h * 4))
        xr = 0
        if full:
            save(T * h * 4)
        else:
            xr = alloc(T * h * 4)
        scaled = alloc(T * h * 4)
        if xr:
            prog.free(xr)
        out = 0
        if full and feeds_linears:
            save(T * h * e)
        else:
            out = alloc(T * h * e)
        prog.free(scaled)
        if src:
            prog.free(src)
        return out

    def weight_grad(name: str) -> None:
        """Full fine-tuning: the node where backward makes this linear's weight gradient (its input is kept
        elsewhere: the norm output, the attention output, the MLP product)."""
        if full:
            lin = all_lins[name]
            layer_.weight_grad(lin.in_features * lin.out_features * lin.count * dt.param)

    def project(name: str, width: int, out: int) -> int:
        """The linear's output handle (T x out in the activation dtype)."""
        weight_grad(name)
        if name not in ctx.lora:
            return alloc(T * out * e)
        base = alloc(T * out * e)
        save(T * width * 4, 0, transient=(T * out * 4, T * width * 4))  # x in fp32, kept by lora_A
        save(T * rank * 4)  # lora_A's output, kept by lora_B
        b = alloc(T * out * 4)
        scaled = alloc(T * out * 4)
        prog.free(b)
        total = alloc(T * out * 4)
        prog.free(scaled)
        prog.free(base)
        res = alloc(T * out * e)
        prog.free(total)
        return res

    def rope(width: int) -> int:
        # q*cos, -x2, cat, rotate_half(q)*sin, the sum (the new q, kept by attention)
        a_ = alloc(T * width * e)
        n_ = alloc(T * width * e // 2)
        c_ = alloc(T * width * e)
        prog.free(n_)
        b_ = alloc(T * width * e)
        prog.free(c_)
        new = alloc(T * width * e)
        prog.free(a_)
        prog.free(b_)
        return new

    def head_norm(width: int, src: int) -> int:
        """Qwen3's q_norm / k_norm (RMSNorm over each head) on a projection's output, which it frees: x.to(fp32)
        kept, pow, x * rsqrt, .to(dtype) (kept when the weight trains), weight * y (RoPE's input)."""
        save(T * width * 4, T * width * e, transient=(T * width * 4,) * 3)
        prog.free(alloc(T * width * 4))
        y32 = alloc(T * width * 4)
        if full:
            save(T * width * e)
            out = alloc(T * width * e)
        else:
            yb = alloc(T * width * e)
            out = alloc(T * width * e)
            prog.free(yb)
        prog.free(y32)
        prog.free(src)
        return out

    q_w, kv_w = a * d, kv * d
    gemma = spec.model_type in GEMMA_NORMS
    normed = gemma_norm(0, True) if gemma else norm()
    if "qkv_proj" in lins:
        q_out = k_out = 0  # q, k and v are views of the fused output
        v_out = project("qkv_proj", h, q_w + 2 * kv_w)
    else:
        q_out = project("q_proj", h, q_w)
        if spec.qk_norm:
            q_out = head_norm(q_w, q_out)
        k_out = project("k_proj", h, kv_w)
        if spec.qk_norm:
            k_out = head_norm(kv_w, k_out)
        v_out = project("v_proj", h, kv_w)
    q_new = rope(q_w)
    prog.free(q_out)
    k_new = rope(kv_w)
    prog.free(k_out)
    if ctx.backend == "math":
        # _scaled_dot_product_attention_math in fp32 with grouped-query heads, as the recorded history of
        # ft_qwen2.5-0.5b fp32 shows it: q scaled (a temporary), then q scaled, k repeated and scaled, v repeated
        # (kept); the scores (masked in place), the softmax (kept), _safe_softmax's byte mask; attn @ v, and its
        # contiguous copy (kept, o_proj's input). The RoPE'd q and k and the projected v go after o_proj.
        S = ctx.w.seq
        scores = T * a * S
        tq = alloc(T * q_w * e)
        save(T * q_w * e, T * q_w * e)
        save(T * q_w * e, T * q_w * e)
        save(T * q_w * e)
        t = alloc(scores * e)
        save(scores * e, scores * e)
        prog.free(alloc(scores))
        prog.free(t)
        av = alloc(T * q_w * e)
        prog.free(tq)
        save(T * q_w * e)
        prog.free(av)
        o_out = project("o_proj", q_w, h)
        prog.free(q_new)
        prog.free(k_new)
        prog.free(v_out)
    else:
        save_handle(q_new, T * q_w * e)
        save_handle(k_new, T * kv_w * e)
        save_handle(v_out, T * kv_w * e)  # v, or the fused qkv output it is a view of
        save(T * q_w * e)  # attention output, kept by the kernel's backward
        save(T * a * 4)  # log-sum-exp, fp32
        o_out = project("o_proj", q_w, h)
    if normed:
        prog.free(normed)
    if gemma:
        o_out = gemma_norm(o_out)  # post-attention norm on the attention output
    # residual + attention output; in fp32 the next norm's pow keeps it (no copy to fp32 is made)
    resid = alloc(T * h * r)
    if fp32:
        save_handle(resid)
    prog.free(o_out)
    # --- MLP
    normed = gemma_norm(0, True) if gemma else norm()
    width = spec.intermediate
    if "gate_up_proj" in lins:
        gate_up = project("gate_up_proj", h, 2 * width)
        save_handle(gate_up, T * width * e)  # gate and up are views of it: kept by the activation and the product
        save(T * width * e, T * width * e, transient=(T * width * e,))  # activation output, kept by the product
    else:
        gate = project("gate_proj", h, width)
        save_handle(gate, T * width * e)  # kept by the activation
        save(T * width * e, T * width * e)  # activation output, kept by the product
        up = project("up_proj", h, width)
        save_handle(up, T * width * e, transient=(T * width * e,))  # kept by the product
    if full:
        prod = 0
        save(T * width * e)  # down_proj's input, kept for its weight gradient
    else:
        prod = alloc(T * width * e)  # down_proj's input
    down_out = project("down_proj", width, h)
    if prod:
        prog.free(prod)
    if normed:
        prog.free(normed)
    if gemma:
        down_out = gemma_norm(down_out)  # post-feedforward norm
    out = alloc(T * h * r)  # the layer's output, residual + MLP output
    prog.free(down_out)
    if fp32:
        save_handle(out)  # kept by the next layer's norm (its pow), like resid above
    else:
        prog.free(resid)
        prog.free(out)  # the caller's residual stream is modelled outside the layer
    return layer_.finish()


def _gpt2_block_forward(prog: Program, ctx: Ctx, keep: bool) -> list[Saved]:
    """GPT-2's block under full fine-tuning without autocast, in the order the recorded H200 history of
    gpt2-medium fp16 (docs/calibration/histories/ft_gpt2m_fp16.json.gz) shows: ln_1's output (kept by c_attn);
    c_attn's packed q/k/v (kept whole: attention keeps views of it); the attention output (kept by its backward
    and by c_proj); c_proj's output, resid_dropout's one-byte mask (kept) and output; the residual (kept by ln_2);
    then ln_2, c_fc (kept), gelu_new written out in Python (0.5*x, tanh and 1+tanh kept, the product kept by the
    second c_proj; x**3 and the sums between are temporaries), the second c_proj and dropout, and the residual
    (kept by the next block's ln_1). LayerNorm keeps its input: the residuals above."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r, width = spec.hidden, dt.act, dt.resid, spec.intermediate
    lins = {lin.name: lin for lin in spec.block_linears}
    layer_ = _Layer(prog, keep)
    alloc, save = layer_.alloc, layer_.save

    def weight_grad(name: str) -> None:
        lin = lins[name]
        layer_.weight_grad(lin.in_features * lin.out_features * dt.param)

    def proj_dropout(name: str) -> int:
        """c_proj's output through dropout: the mask is kept, the output returned."""
        weight_grad(name)
        out = alloc(T * h * e)
        save(T * h)  # dropout's mask, one byte per element
        dropped = alloc(T * h * e)
        prog.free(out)
        return dropped

    save(T * h * e, T * h * e)  # ln_1 output
    weight_grad("c_attn")
    save(T * 3 * h * e, T * 3 * h * e)  # packed q, k, v
    save(T * h * e, T * h * e)  # attention output
    save(T * spec.heads * 4)  # log-sum-exp
    attn_drop = proj_dropout("c_proj")
    save(T * h * r, T * h * e)  # residual, kept by ln_2
    save(T * h * e, T * h * e)  # ln_2 output
    weight_grad("c_fc")
    save(T * width * e, T * width * e)  # c_fc output, gelu_new's input
    save(T * width * e, T * width * e)  # 0.5 * x
    cube = alloc(T * width * e)  # x ** 3
    t = alloc(T * width * e)  # 0.044715 * x**3
    prog.free(cube)
    for _ in range(2):  # x + ..., sqrt(2/pi) * (...)
        t2 = alloc(T * width * e)
        prog.free(t)
        t = t2
    save(T * width * e, T * width * e)  # tanh(...), kept by its backward
    prog.free(t)
    save(T * width * e, T * width * e)  # 1 + tanh(...)
    save(T * width * e, T * width * e)  # the product, the second c_proj's input
    mlp_drop = proj_dropout("mlp.c_proj")
    save(T * h * r, T * h * e)  # residual, kept by the next block's ln_1
    prog.free(attn_drop)
    prog.free(mlp_drop)
    return layer_.finish()


def block_forward(prog: Program, ctx: Ctx, layer: int, keep: bool) -> list[Saved]:
    """One decoder layer's forward over ctx.tokens tokens. With keep=False (no_grad, or recomputed later by
    checkpointing) nothing is saved and only the transient peak is simulated."""
    if _recorded_layer_order(ctx, layer):
        return _plain_block_forward(prog, ctx, layer, keep)
    if (
        ctx.spec.model_type == "gpt2"
        and ctx.full
        and not ctx.dt.autocast
        and ctx.backend in ("flash", "efficient")
        and ctx.w.task == "train"
    ):
        return _gpt2_block_forward(prog, ctx, keep)
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, a, kv, d = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    e, r = dt.act, dt.resid
    full = ctx.full
    layer_ = _Layer(prog, keep)
    save, tmp, drop = layer_.save, layer_.tmp, layer_.drop

    def norm() -> int:
        """RMSNorm as LlamaRMSNorm runs it: x.to(fp32) (kept by pow; in fp32 runs the input itself), pow,
        mean, rsqrt (kept), x * rsqrt in fp32, .to(dtype) (kept by weight * y when the weight trains), then
        weight * y. Gemma2RMSNorm keeps the fp32 y instead. LayerNorm keeps its input. Returns the output's
        handle: kept when the projections that read it keep it, else a temporary dropped after them.
        Backward of the fp32 norm holds about three fp32 temporaries of the input's size."""
        if spec.norm == "layer":
            save(T * h * r, T * h * e)
        else:
            save(T * h * 4, T * h * e, (), (T * h * 4,) * 3)
            drop(tmp(T * h * 4))  # x ** 2
            y32 = tmp(T * h * 4)
            if full:
                save(T * h * (4 if spec.model_type in GEMMA_NORMS else r))
            else:
                yb = tmp(T * h * r)
            out = tmp(T * h * r) if not (full and not dt.autocast) else 0
            drop(y32)
            if not full:
                drop(yb)
            if out:
                return out
        if full and not dt.autocast:
            save(T * h * e)  # the norm output, kept (once) by the projections that read it
            return 0
        return tmp(T * h * r)

    def rope(width: int) -> None:
        # q*cos + rotate_half(q)*sin: the product, -x2, cat, its product with sin; the sum is the new q
        a_ = tmp(T * width * e)
        n_ = tmp(T * width * e // 2)
        c_ = tmp(T * width * e)
        drop(n_)
        b_ = tmp(T * width * e)
        drop(c_)
        drop(a_)
        drop(b_)

    def linear_in(lin: Linear, width: int, shared: bool) -> None:
        """What a linear keeps of its input: the input when the weight trains (once per shared input; autocast
        makes and keeps a bf16 copy per call), and peft's fp32 copy of the input for an adapter."""
        w_grad = lin.in_features * lin.out_features * lin.count * dt.param
        if ctx.w.method == "qlora":
            # bitsandbytes MatMul4Bit dequantizes the NF4 weight to the compute dtype for each matmul
            prog.transient("quantization_temporaries", lin.in_features * lin.out_features * e)
        if full and (dt.autocast or not shared):
            save(T * width * e, 0, (w_grad,))
        elif full:
            # the shared input is already kept (once, by the norm): this node only makes the weight's gradient
            layer_.weight_grad(w_grad)
        if lin.name in ctx.lora:
            # peft's Linear.forward: x cast to the adapter's fp32 (kept by lora_A), lora_A's output (kept by
            # lora_B), then lora_B's output, its product with the scaling and the sum with the base output, all
            # in fp32 before the result is cast back; backward makes fp32 gradients of the same sizes
            out = T * lin.out_features * 4
            save(T * width * (2 if dt.autocast else 4), 0, (), (out, T * width * 4))
            save(T * ctx.w.lora_r * 4, 0, ())
            prog.transient("activations", out, out)

    lins = {lin.name: lin for lin in spec.block_linears}
    # --- attention
    normed = norm()
    q_width = a * (spec.qk_nope_dim + spec.qk_rope_dim) if spec.mla else a * d
    kv_width = kv * d if not spec.mla else 0
    inputs = ("q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn", "kv_a_proj_with_mqa", "query_key_value", "q_a_proj")
    for name in inputs:
        if name in lins:
            linear_in(lins[name], h, True)
    if "q_b_proj" in lins:  # deepseek-v3: q_a_proj -> q_a_layernorm -> q_b_proj
        save(T * spec.q_lora_rank * 4, T * spec.q_lora_rank * e)
        linear_in(lins["q_b_proj"], spec.q_lora_rank, False)
    if spec.mla:
        # kv_a output (compressed latent) -> RMSNorm -> kv_b_proj -> per-head K_nope and V
        latent = spec.kv_lora_rank + spec.qk_rope_dim
        save(T * latent * 4, T * latent * e)
        linear_in(lins["kv_b_proj"], spec.kv_lora_rank, False)
        k_width = a * (spec.qk_nope_dim + spec.qk_rope_dim)
        v_width = a * spec.v_head_dim
    else:
        k_width = v_width = kv_width
    if spec.qk_norm:
        save(T * (q_width + k_width) * 4, T * (q_width + k_width) * e)
    # the projections' q and k outputs live until RoPE has made its own (mul keeps only cos and sin)
    q_out, k_out = tmp(T * q_width * e), tmp(T * k_width * e)
    if normed:
        drop(normed)
    if spec.model_type != "gpt2":
        rope(q_width)
        rope(k_width)
    out_width = a * (spec.v_head_dim or d)
    backend = ctx.backend
    expanded = backend in ("eager", "efficient") and ctx.mask and k_width < q_width
    kq = q_width if (expanded or (backend == "eager" and k_width < q_width)) else k_width
    vq = out_width if (expanded or (backend == "eager" and v_width < out_width)) else v_width
    drop(q_out)
    drop(k_out)
    if backend in ("flash", "efficient"):
        save(T * q_width * e, T * q_width * e)  # q after RoPE
        save(T * kq * e, T * kq * e)
        # v; a fused qkv_proj (phi-3) hands attention a view of its output, which keeps all of it alive (the
        # recorded H200 history of phi-3-mini LoRA: 36 MiB per layer at 2048 tokens, not 12)
        fused_v = ("qkv_proj" in lins or "query_key_value" in lins) and vq == v_width
        save(T * (q_width + k_width + v_width if fused_v else vq) * e, T * vq * e)
        save(T * out_width * e)  # output, also o_proj's input
        save(T * a * 4)  # log-sum-exp, fp32
    else:
        S = ctx.w.seq
        scores = T * a * S  # elements: batch * heads * seq * seq
        if backend == "math":
            # _scaled_dot_product_attention_math as the recorded history of ft_qwen2.5-0.5b fp32 shows it: q and
            # k scaled (k repeated to all heads), v repeated, kept; the scores (causal mask added in place);
            # _safe_softmax's output, kept; its one-byte mask of fully masked entries, dropped with the scores
            save(T * q_width * e, T * q_width * e)  # q * sqrt(scale)
            save(T * q_width * e, T * q_width * e)  # k * sqrt(scale), repeated to all heads
            save(T * out_width * e)  # v, repeated
            t = tmp(scores * e)  # q @ k^T, masked in place
            save(scores * e, scores * e)  # softmax output
            drop(tmp(scores))  # _safe_softmax: scores == -inf, one byte per score
            drop(t)
        else:  # eager: matmul, * scaling, + mask, softmax in fp32, .to(dtype), matmul with v
            save(T * q_width * e)
            save(T * kq * e, T * kq * e)
            t = tmp(scores * e)
            t2 = tmp(scores * e)
            drop(t)
            t3 = tmp(scores * e)
            drop(t2)
            up = tmp(scores * 4) if softmax_upcast_copy(ctx) else 0  # softmax's fp32 copy of a bf16 input
            save(scores * 4, scores * 4)
            if up:
                drop(up)
            drop(t3)
            save(scores * e, scores * e)
            save(T * vq * e)
        save(T * out_width * e)  # transpose(1, 2).contiguous() for o_proj
    o = lins.get("o_proj") or lins.get("c_proj") or lins.get("dense")
    if o is not None:
        linear_in(o, out_width, True)
    o_out = tmp(T * h * e)
    resid = tmp(T * h * r)  # residual + attention output
    drop(o_out)
    if spec.model_type == "gpt2" and ctx.w.task == "train":
        save(T * h)  # resid_pdrop dropout keeps a bool mask
    for _ in range(spec.norms_per_layer - 2):
        extra = norm()  # gemma2's post-attention norm (its pre/post-feedforward pair adds one more below)
        if extra:
            drop(extra)
    # --- MLP
    normed = norm()
    width, fan = _mlp_width(spec, layer)
    Tm = T * fan
    gate_up = [n for n in ("gate_proj", "up_proj", "gate_up_proj", "c_fc", "dense_h_to_4h") if n in lins]
    for name in gate_up:
        lin = lins[name]
        if lin.count > 1:
            save(Tm * h * e)  # tokens gathered per expert
        linear_in(lin, h, True)
    if normed:
        drop(normed)
    if spec.gated_mlp:
        save(Tm * width * e, Tm * width * e)  # gate output, kept by the activation
        save(Tm * width * e, Tm * width * e)  # up output, kept by the product
        # activation output, kept by the product, whose backward makes both operands' gradients at once
        save(Tm * width * e, Tm * width * e, (), (Tm * width * e,))
    elif spec.model_type == "gpt_neox":  # nn.GELU (one op) keeps its input; its output is dense_4h_to_h's input
        save(Tm * width * e, Tm * width * e)
    else:  # gpt2's gelu_new is written out in Python: x, tanh(...), 0.5*x and 1+tanh(...) are kept
        # under autocast pow runs in fp32 (autocast's fp32 op list), so tanh(...), 1+tanh(...) and the product
        # are fp32; the product is cast back to bf16 for c_proj
        f = 4 if dt.autocast else e
        save(Tm * width * e, Tm * width * e)
        save(Tm * width * f)
        save(Tm * width * e)
        save(Tm * width * f)
        if dt.autocast:
            prog.transient("activations", Tm * width * 4)
    down = lins.get("down_proj") or lins.get("mlp.c_proj") or lins.get("dense_4h_to_h")
    if down is not None:
        lin = Linear(down.name, down.in_features, down.out_features, down.bias, 1)
        if full:
            save(Tm * width * e, 0, (down.in_features * down.out_features * down.count * dt.param,))
        elif down.name in ctx.lora:
            linear_in(lin, width, False)
    if spec.shared_intermediate and layer >= spec.dense_layers:
        s = spec.shared_intermediate
        for _ in range(4):
            save(T * s * e, T * s * e)
    if spec.model_type == "gpt2" and ctx.w.task == "train":
        save(T * h)
    for _ in range(spec.norms_per_layer - 2 - 1):
        extra = norm()
        if extra:
            drop(extra)
    down_out = tmp(T * h * e)
    tmp(T * h * r)  # the layer's output, residual + MLP output (dropped with the other temporaries below)
    drop(down_out)
    drop(resid)
    return layer_.finish()


def block_nograd(
    prog: Program, ctx: Ctx, x: int, layer: int, cache_kv: bool, keep_input: bool = False
) -> tuple[int, list[int]]:
    """One decoder layer's forward without autograd (inference, or the first pass of a checkpointed layer):
    tensors are freed as soon as Python drops them. Returns the new residual handle and, with cache_kv,
    the layer's K and V (kept as the KV cache; otherwise they are freed)."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r = spec.hidden, dt.act, dt.resid
    q_w = spec.heads * (spec.qk_nope_dim + spec.qk_rope_dim) if spec.mla else spec.heads * spec.head_dim
    k_w = q_w if spec.mla else spec.kv_heads * spec.head_dim
    v_w = spec.heads * spec.v_head_dim if spec.mla else k_w
    out_w = spec.heads * (spec.v_head_dim or spec.head_dim)
    width, fan = _mlp_width(spec, layer)

    def norm() -> int:
        return rms_norm_nograd(prog, T, h, r, gemma=spec.model_type == "gemma3_text")

    def rope(width: int) -> int:
        # q*cos + rotate_half(q)*sin: the product, -x2, cat, its product with sin, the sum
        a = prog.alloc("activations", T * width * e)
        neg = prog.alloc("activations", T * width * e // 2)
        cat = prog.alloc("activations", T * width * e)
        prog.free(neg)
        b = prog.alloc("activations", T * width * e)
        prog.free(cat)
        out = prog.alloc("activations", T * width * e)
        prog.free(a)
        prog.free(b)
        if spec.model_type == "phi3":
            # phi-3's apply_rotary_pos_emb concatenates the rotated part with the pass-through part (empty when
            # all of the head rotates): one more copy (the recorded history of gen_phi3_b104)
            whole = prog.alloc("activations", T * width * e)
            prog.free(out)
            out = whole
        return out

    if spec.model_type == "gpt2":
        return _gpt2_block_nograd(prog, ctx, x, cache_kv, keep_input)
    if spec.model_type == "gpt_neox" and spec.parallel_residual:
        return _neox_block_nograd(prog, ctx, x, cache_kv, keep_input)
    normed = norm()
    # phi-3's fused qkv_proj: q, k and v are views of one output, alive until v is rebound to the cache's copy
    fused_qkv = any(lin.name.endswith("qkv_proj") for lin in spec.block_linears)
    if fused_qkv:
        qkv = prog.alloc("activations", T * (q_w + k_w + v_w) * e)
        q = k = v = 0
    else:
        qkv = 0
        q = prog.alloc("activations", T * q_w * e)
        k = prog.alloc("activations", T * k_w * e)
        v = prog.alloc("activations", T * v_w * e)
    q2 = rope(q_w)
    k2 = rope(k_w)
    prog.free(q)
    prog.free(k)
    kept: list[int] = []
    if cache_kv:
        # DynamicCache stores its own copies of the rotated K and of V and hands those to attention: the layer's
        # own K and V go at once (the recorded history of gen_llama1b_fp16)
        kept = [prog.alloc("kv_cache", T * k_w * e), prog.alloc("kv_cache", T * v_w * e)]
        prog.free(k2)
        prog.free(v)
    probs = 0
    if ctx.backend == "eager":
        attn, probs = _eager_nograd(prog, ctx, q_w, k_w, v_w, out_w)
    else:
        math_tmps: list[int] = []
        if ctx.backend == "math":
            # _scaled_dot_product_attention_math without autograd (aten attention.cpp): q * sqrt(scale), K and V
            # repeated to every head (enable_gqa), kᵀ * sqrt(scale), the scores (the causal mask added in place),
            # _safe_softmax's output and its one-byte mask of fully masked entries: 9 bytes per fp32 score at the
            # peak (llama-3.2-1b fp32 prefill, 2 x 8192 on the H200: 42.76 GiB allocated; 12 bytes gave +27%)
            scores = T * spec.heads * (ctx.w.seq if ctx.w.batch * ctx.w.seq == T else 1)
            math_tmps.append(prog.alloc("activations", T * q_w * e))
            if k_w < q_w:
                math_tmps += [prog.alloc("activations", T * q_w * e), prog.alloc("activations", T * out_w * e)]
            ks = prog.alloc("activations", T * q_w * e)
            att = prog.alloc("activations", scores * e)
            prog.free(ks)
            math_tmps.append(prog.alloc("activations", scores * e))
            prog.transient("activations", scores)
            prog.free(att)
        attn = prog.alloc("activations", T * out_w * e)
        prog.free_all(math_tmps)
        if not cache_kv:
            # the kernel's log-sum-exp; in inference the H200's kernel writes none (gen_llama1b_fp16: the attention
            # output and three tiny philox/stat tensors only)
            prog.transient("activations", T * spec.heads * 4)
    if not cache_kv:
        prog.free(k2)
        prog.free(v)
    o = prog.alloc("activations", T * h * e)
    prog.free(attn)
    prog.free(probs)
    prog.free(qkv)  # a fused projection's output is a local of the attention module: it goes when that returns
    prog.free(q2)
    prog.free(normed)
    x2 = prog.alloc("activations", T * h * r)
    prog.free(o)
    normed = norm()
    Tm = T * fan
    if any(lin.name.endswith("gate_up_proj") for lin in spec.block_linears):
        # phi-3: gate and up are chunks (views) of one output, alive until the MLP returns; silu(gate), the product
        fused = prog.alloc("activations", 2 * Tm * width * e)
        act = prog.alloc("activations", Tm * width * e)
        prod = prog.alloc("activations", Tm * width * e)
        prog.free(act)
        down = prog.alloc("activations", T * h * e)
        prog.free(prod)
        prog.free(fused)
    else:
        routed = 0
        if spec.model_type == "llama4_text" and fan > 1:
            # Llama4TextMoe: hidden_states.repeat(num_experts, 1), then that times the router's scores
            rep = prog.alloc("activations", Tm * h * e)
            routed = prog.alloc("activations", Tm * h * e)
            prog.free(rep)
        gate = prog.alloc("activations", Tm * width * e)
        prog.free(routed)
        act = prog.alloc("activations", Tm * width * e)
        prog.free(gate)
        if spec.gated_mlp:
            up = prog.alloc("activations", Tm * width * e)
            prod = prog.alloc("activations", Tm * width * e)
            prog.free(act)
            prog.free(up)
        else:  # gpt_neox: fc, GELU
            prod = act
        down = prog.alloc("activations", T * h * e)
        prog.free(prod)
    prog.free(normed)
    x3 = prog.alloc("activations", T * h * r)
    prog.free(down)
    prog.free(x2)
    if not keep_input:
        prog.free(x)  # the caller's loop variable holds the layer's input until the layer returns
    return x3, kept


def _neox_block_nograd(prog: Program, ctx: Ctx, x: int, cache_kv: bool, keep_input: bool) -> tuple[int, list[int]]:
    """GPTNeoXLayer without autograd, as transformers runs it: LayerNorm (one output), the fused query_key_value
    (q, k, v are views of it until the attention returns), rotary on the first rotary_dims of each head
    (q_rot * cos + rotate_half(q_rot) * sin, then torch.cat with the pass-through part), the cache's own copies of
    K and V, the kernel's output and its transposed copy, dense; then the parallel MLP on a second LayerNorm of the
    same input (dense_h_to_4h, GELU, dense_4h_to_h) and mlp + attention + input."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r = spec.hidden, dt.act, dt.resid
    w = spec.heads * spec.head_dim
    rot = spec.heads * (spec.rotary_dims or spec.head_dim)
    alloc, free = prog.alloc, prog.free
    ln1 = alloc("activations", T * h * r)
    qkv = alloc("activations", T * 3 * w * e)

    def rope_part() -> int:
        a = alloc("activations", T * rot * e)
        neg = alloc("activations", T * rot * e // 2)
        cat = alloc("activations", T * rot * e)
        free(neg)
        b = alloc("activations", T * rot * e)
        free(cat)
        out = alloc("activations", T * rot * e)
        free(a)
        free(b)
        return out

    q_rot, k_rot = rope_part(), rope_part()
    q = alloc("activations", T * w * e)  # torch.cat((q_embed, q_pass), dim=-1)
    free(q_rot)
    k = alloc("activations", T * w * e)
    free(k_rot)
    kept = [alloc("kv_cache", T * w * e), alloc("kv_cache", T * w * e)] if cache_kv else []
    out = alloc("activations", T * w * e)
    prog.transient("activations", T * spec.heads * 4)  # the kernel's log-sum-exp
    out_t = alloc("activations", T * w * e)  # transpose(1, 2).contiguous()
    free(out)
    attn = alloc("activations", T * h * e)  # dense
    free(out_t)
    free(q)
    free(k)
    free(qkv)
    free(ln1)
    ln2 = alloc("activations", T * h * r)
    fc = alloc("activations", T * spec.intermediate * e)
    act = alloc("activations", T * spec.intermediate * e)
    free(fc)
    mlp = alloc("activations", T * h * e)
    free(act)
    free(ln2)
    s1 = alloc("activations", T * h * r)  # mlp_output + attn_output
    free(mlp)
    free(attn)
    x2 = alloc("activations", T * h * r)  # ... + hidden_states
    free(s1)
    if not keep_input:
        prog.free(x)
    return x2, kept


def softmax_upcast_copy(ctx: Ctx) -> bool:
    """`softmax(x, dim, dtype=torch.float32)` on a bf16 input first makes an fp32 copy of it and then the fp32
    output; only fp16 on CUDA takes the fused half-to-float kernel (aten/src/ATen/native/SoftMax.cpp, `softmax`:
    `input_.is_cuda() && input_.scalar_type() == ScalarType::Half && dtype == ScalarType::Float`). Under bf16
    autocast the cast to fp32 is autocast's (softmax is on its fp32 list): the same copy."""
    return ctx.w.precision in ("bf16", "mixed")


def rms_norm_nograd(prog: Program, tokens: int, h: int, r: int, gemma: bool = False) -> int:
    """LlamaRMSNorm without autograd as it runs: x.to(fp32) (a copy unless already fp32), pow(2), mean, + eps,
    rsqrt, x * rsqrt, .to(dtype), weight * y (the order of a traced run and of the recorded history of
    gen_llama1b_fp16). Gemma3RMSNorm (`gemma`) keeps the product in fp32: x.float(), the same normalisation, then
    `* (1.0 + weight.float())` in fp32 and `.type_as(x)` (transformers models/gemma3/modeling_gemma3.py).
    Returns the output's handle."""
    T = tokens
    x32 = prog.alloc("activations", T * h * 4) if r == 2 else 0
    sq = prog.alloc("activations", T * h * 4)
    mean = prog.alloc("activations", T * 4)
    prog.free(sq)
    eps = prog.alloc("activations", T * 4)
    rs = prog.alloc("activations", T * 4)
    prog.free(eps)
    y32 = prog.alloc("activations", T * h * 4)
    prog.free(rs)
    prog.free(x32)
    if gemma:
        scaled = prog.alloc("activations", T * h * 4)
        prog.free(y32)
        prog.free(mean)
        out = prog.alloc("activations", T * h * r) if r == 2 else scaled
        if r == 2:
            prog.free(scaled)
        return out
    yb = prog.alloc("activations", T * h * r) if r == 2 else 0
    out = prog.alloc("activations", T * h * r)
    prog.free(yb)
    prog.free(y32)
    prog.free(mean)
    return out


class Sampler:
    """generate()'s greedy sampling after each forward, as the recorded history of gen_llama1b_fp16 shows it
    (transformers generation/utils.py `_sample` and logits_process.py): lm_head's output for the last position;
    its fp32 copy `next_token_logits` (kept until the next step's copy replaces it); the two minimum-length
    processors the probe's `min_new_tokens` adds, each a `scores.clone()`-sized fp32 tensor, a torch.where
    result and an int64 vocabulary index, the last result kept until the next step's processors are done."""

    def __init__(self, prog: Program, batch: int, vocab: int, act: int) -> None:
        self.prog, self.B, self.V, self.e = prog, batch, vocab, act
        self.logits_copy = 0
        self.scores = 0

    def step(self) -> None:
        prog, B, V = self.prog, self.B, self.V
        out = prog.alloc("logits_and_loss", B * V * self.e)
        copy = prog.alloc("logits_and_loss", B * V * 4)
        prog.free(self.logits_copy)
        self.logits_copy = copy
        result = 0
        for _ in range(2):
            t = prog.alloc("logits_and_loss", B * V * 4)
            index = prog.alloc("logits_and_loss", V * 8)
            new = prog.alloc("logits_and_loss", B * V * 4)
            prog.free(t)
            prog.free(index)
            prog.free(result)
            result = new
        prog.free(self.scores)
        self.scores = result
        prog.free(out)

    def finish(self) -> None:
        self.prog.free(self.logits_copy)
        self.prog.free(self.scores)


def rotary_tables(prog: Program, ctx: Ctx, batch: int, seq: int, first_matmul: bool) -> list[int]:
    """The rotary embedding's cos and sin for a forward pass, kept until it ends (LlamaRotaryEmbedding.forward, as
    the recorded history of gen_llama1b_fp16 shows it): inv_freq @ positions in fp32 (the first matmul of the
    job, which makes the forward's cuBLAS workspace), cat(freqs, freqs), cos() and sin() times the attention
    scaling, cast to the model's dtype. Returns the handles of cos and sin (none for GPT-2's learned positions)."""
    spec = ctx.spec
    if spec.model_type == "gpt2":
        if first_matmul:
            prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
        return []
    dim = spec.qk_rope_dim if spec.mla else spec.head_dim
    n = batch * seq * dim  # elements of cos (or sin)
    freqs = prog.alloc("activations", n * 2)  # (B, dim/2, S) fp32
    if first_matmul:
        prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
    emb = prog.alloc("activations", n * 4)
    tables = []
    for _ in ("cos", "sin"):
        t = prog.alloc("activations", n * 4)
        scaled = prog.alloc("activations", n * 4)
        prog.free(t)
        tables.append(scaled)
    out = [prog.alloc("activations", n * ctx.dt.act) for _ in tables]
    prog.free(freqs)
    prog.free(emb)
    prog.free_all(tables)
    return out


def eager_mask(prog: Program, ctx: Ctx, batch: int, seq: int) -> int:
    """The float mask eager attention adds to its scores, built once per forward (transformers masking_utils
    `eager_mask`: the causal boolean [1, 1, S, S], expanded to the batch, then torch.where(mask, 0, min) in the
    model's dtype: [B, 1, S, S]). Returns its handle (0 for the SDPA kernels, which take is_causal)."""
    if ctx.backend != "eager":
        return 0
    causal = prog.alloc("activations", seq * seq)
    mask = prog.alloc("activations", batch * seq * seq * ctx.dt.param)
    prog.free(causal)
    return mask


def _eager_nograd(prog: Program, ctx: Ctx, q_w: int, k_w: int, v_w: int, out_w: int) -> tuple[int, int]:
    """transformers' eager_attention_forward without autograd, in the order it allocates: K and V repeated to
    every head (repeat_kv), q @ k^T, `* scaling`, `+ mask`, softmax in fp32 (with bf16's upcast copy),
    `.to(dtype)` (the probabilities, returned as attn_weights and so alive until the attention module returns),
    probabilities @ v and its transpose(1, 2).contiguous(). Returns the handles of attention's output and of the
    probabilities."""
    spec, e, T = ctx.spec, ctx.dt.act, ctx.tokens
    kv_len = ctx.w.seq if ctx.w.batch * ctx.w.seq == T else 1
    scores = T * spec.heads * kv_len  # elements: batch * heads * query * key
    kq = prog.alloc("activations", T * q_w * e) if k_w < q_w else 0
    vq = prog.alloc("activations", T * out_w * e) if v_w < out_w else 0
    mm = prog.alloc("activations", scores * e)
    scaled = prog.alloc("activations", scores * e)
    prog.free(mm)
    masked = prog.alloc("activations", scores * e)
    prog.free(scaled)
    up = prog.alloc("activations", scores * 4) if softmax_upcast_copy(ctx) else 0
    sm = prog.alloc("activations", scores * 4)
    prog.free(up)
    probs = prog.alloc("activations", scores * e)
    prog.free(sm)
    prog.free(masked)
    av = prog.alloc("activations", T * out_w * e)
    out = prog.alloc("activations", T * out_w * e)  # transpose(1, 2).contiguous()
    prog.free(av)
    prog.free(kq)
    prog.free(vq)
    return out, probs


def _gpt2_block_nograd(prog: Program, ctx: Ctx, x: int, cache_kv: bool, keep_input: bool) -> tuple[int, list[int]]:
    """GPT-2's block without autograd: LayerNorm, one packed q/k/v projection, learned positions (no RoPE),
    and gelu_new written out in Python (0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3)))), whose temporaries
    make the MLP's peak four intermediate-sized tensors."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r, width = spec.hidden, dt.act, dt.resid, spec.intermediate
    ln = prog.alloc("activations", T * h * r)
    qkv = prog.alloc("activations", T * 3 * h * e)
    kept = [prog.alloc("kv_cache", T * h * e), prog.alloc("kv_cache", T * h * e)] if cache_kv else []
    attn = prog.alloc("activations", T * h * e)
    prog.transient("activations", T * spec.heads * 4)  # log-sum-exp
    merged = prog.alloc("activations", T * h * e)  # heads merged back, contiguous
    prog.free(attn)
    prog.free(qkv)
    prog.free(ln)
    o = prog.alloc("activations", T * h * e)
    prog.free(merged)
    x2 = prog.alloc("activations", T * h * r)
    prog.free(o)
    ln = prog.alloc("activations", T * h * r)
    fc = prog.alloc("activations", T * width * e)
    prog.free(ln)
    half = prog.alloc("activations", T * width * e)  # 0.5 * x
    cube = prog.alloc("activations", T * width * e)  # x ** 3
    t = prog.alloc("activations", T * width * e)  # 0.044715 * x**3
    prog.free(cube)
    for _ in range(4):  # x + ..., * sqrt(2/pi), tanh, 1 + ...: each replaces the last
        t2 = prog.alloc("activations", T * width * e)
        prog.free(t)
        t = t2
    act = prog.alloc("activations", T * width * e)
    prog.free(half)
    prog.free(t)
    prog.free(fc)
    down = prog.alloc("activations", T * h * e)
    prog.free(act)
    x3 = prog.alloc("activations", T * h * r)
    prog.free(down)
    prog.free(x2)
    if not keep_input:
        prog.free(x)
    return x3, kept


def block_backward(prog: Program, saved: list[Saved], grads: list[int], accumulate: bool) -> None:
    """Walk one layer's saved tensors in reverse: each node allocates its input gradient, then frees what it
    kept and the gradient it consumed; weight gradients appear at their linear (with gradient accumulation
    after the first micro-batch the new gradient is added into .grad and freed)."""
    current: int | None = None
    for node in reversed(saved):
        for g in node.param_grads:
            handle = prog.alloc("gradients", g)
            if accumulate:
                prog.free(handle)
            else:
                grads.append(handle)
        if node.transient:
            prog.transient("activations", *node.transient)
        new = prog.alloc("activations", node.grad_bytes) if node.grad_bytes else None
        if node.handle != NOTHING_KEPT:
            prog.free(node.handle)
        if new is not None:
            if current is not None:
                prog.free(current)
            current = new
    if current is not None:
        prog.free(current)


# ---------------------------------------------------------------------------------------------- the job
def final_norm_forward(prog: Program, ctx: Ctx, x: int) -> tuple[list[int], int]:
    """The model's last RMSNorm under autograd, in the recorded order (ft_qwen3_06b_b8): x.to(fp32) (kept),
    pow (a temporary), mean, + eps, rsqrt (kept), x * rsqrt (freed once cast), .to(dtype) (kept by the weight's
    product), weight * y: the output, lm_head's input. The freed temporaries leave the blocks that backward's
    cuBLAS workspace later takes. In 16 bits the last residual goes here (the norm saved its fp32 copy); in fp32
    the norm saves the residual itself. Returns the kept handles and the residual's handle if still held (0 if
    freed)."""
    T, h, e, r = ctx.tokens, ctx.spec.hidden, ctx.dt.act, ctx.dt.resid
    kept = [prog.alloc("activations", T * h * 4)] if r == 2 else []
    prog.free(prog.alloc("activations", T * h * 4))  # pow(2)
    kept.append(prog.alloc("activations", T * 4))  # mean, then rsqrt: kept
    scaled = prog.alloc("activations", T * h * 4)
    if r == 2:
        kept.append(prog.alloc("activations", T * h * r))
    kept.append(prog.alloc("activations", T * h * e))
    prog.free(scaled)
    if r == 2:
        prog.free(x)
        x = 0
    return kept, x


def logits_and_loss_forward(prog: Program, ctx: Ctx) -> list[int]:
    """lm_head output -> .float() -> log_softmax (kept) ; returns handles kept for backward."""
    T, V, e = ctx.tokens, ctx.spec.vocab, ctx.dt.act
    logits = prog.alloc("logits_and_loss", T * V * e)
    kept: list[int] = []
    if ctx.spec.logit_softcap:
        # gemma2: logits / cap (the logits go), tanh (kept), * cap, as the recorded history of gemma-2-2b shows
        t = prog.alloc("logits_and_loss", T * V * e)
        prog.free(logits)
        kept.append(prog.alloc("logits_and_loss", T * V * e))
        prog.free(t)
        logits = prog.alloc("logits_and_loss", T * V * e)
    up = prog.alloc("logits_and_loss", T * V * 4) if e != 4 else None
    kept.append(prog.alloc("logits_and_loss", T * V * 4))  # log_softmax output
    if up is not None:
        prog.free(up)
    prog.free(logits)  # the model output (and its bf16 logits) is dropped once .loss is taken
    return kept


def logits_and_loss_backward(prog: Program, ctx: Ctx, kept: list[int]) -> int:
    T, V, e = ctx.tokens, ctx.spec.vocab, ctx.dt.act
    g1 = prog.alloc("logits_and_loss", T * V * 4)  # nll_loss backward
    g2 = prog.alloc("logits_and_loss", T * V * 4)  # log_softmax backward
    prog.free(kept.pop())
    prog.free(g1)
    g3 = prog.alloc("logits_and_loss", T * V * e) if e != 4 else g2
    if g3 != g2:
        prog.free(g2)
    for h in reversed(kept):  # softcap: the gradient through * cap, tanh (its kept output goes) and / cap
        for step in range(3):
            g4 = prog.alloc("logits_and_loss", T * V * e)
            prog.free(g3)
            if step == 1:
                prog.free(h)
            g3 = g4
    return g3


class _Fsdp:
    """FSDP2 (fully_shard on every decoder layer, then on the model) as the recorded H200 history of
    fsdp2_llama8b shows it, per unit (a layer, or the root: embeddings, final norm, lm_head):

    - all-gather: a flat buffer of the unit's full size on the all-gather stream, copied out into one full tensor
      per parameter on the compute stream; the flat buffer goes after the next unit's copy-out;
    - forward: every layer is resharded (its full tensors freed) after its forward; the root stays gathered until
      the end of backward; backward prefetches the next layer's all-gather before it computes;
    - reduce-scatter: the unit's full gradients are copied into a flat buffer on the compute stream and freed;
      the output (this GPU's shard of the gradient) is allocated on the reduce-scatter stream and kept until the
      optimizer's zero_grad; the flat input goes when the next reduce-scatter starts.
    """

    GATHER_STREAM = 1
    REDUCE_STREAM = 2

    def __init__(self, prog: Program, units: list[list[int]], shards: int) -> None:
        self.prog = prog
        self.units = units
        self.n = shards
        self.root = len(units) - 1
        self.flats: list[int] = []  # all-gather buffers not yet freed, oldest first
        self.outputs: dict[int, list[int]] = {}
        self.pending = 0  # the last reduce-scatter's input

    def gather(self, unit: int) -> None:
        self.flats.append(self.prog.alloc("fsdp_all_gather_buffers", sum(self.units[unit])))
        self.outputs[unit] = [self.prog.alloc("fsdp_gathered_params", b) for b in self.units[unit]]
        while len(self.flats) > 1:
            self.prog.free(self.flats.pop(0))

    def prefetch(self, unit: int) -> None:
        """Backward's all-gather issued one layer ahead: the flat buffer now, the copy-out when it is used."""
        self.flats.append(self.prog.alloc("fsdp_all_gather_buffers", sum(self.units[unit])))

    def copy_out(self, unit: int) -> None:
        self.outputs[unit] = [self.prog.alloc("fsdp_gathered_params", b) for b in self.units[unit]]
        self.prog.free(self.flats.pop(0))

    def reshard(self, unit: int) -> None:
        self.prog.free_all(self.outputs.pop(unit, []))

    def reduce_scatter(self, nbytes: int, full_grads: list[int], accumulate: bool) -> int:
        """Returns the handle of this GPU's gradient shard (0 when it was added into an existing one)."""
        if not nbytes:
            return 0
        if self.pending:
            self.prog.free(self.pending)
        self.pending = self.prog.alloc("fsdp_reduce_scatter_buffers", nbytes)
        self.prog.free_all(full_grads)
        shard = self.prog.alloc("sharded_gradients", -(-nbytes // self.n))
        if accumulate:
            self.prog.free(shard)
            return 0
        return shard

    def finish(self) -> None:
        self.prog.free_all(self.flats)
        self.flats = []
        if self.pending:
            self.prog.free(self.pending)
            self.pending = 0


def train_program(spec: ModelSpec, w: Workload, *, meta_init: bool = False) -> Program:
    """STEPS optimizer steps (states appear in the first), each of grad_accum micro-batches (at most two are
    simulated: the second already has the first's gradients alive)."""
    ctx = make_ctx(spec, w)
    streams = {"fsdp_all_gather_buffers": _Fsdp.GATHER_STREAM, "sharded_gradients": _Fsdp.REDUCE_STREAM}
    prog = Program(streams=streams if ctx.shards > 1 else {})
    weights = load_weights(prog, ctx, whole_first=not meta_init)
    trainable, cast_bytes = weights.trainable, weights.cast_bytes
    h, T, e, r = spec.hidden, ctx.tokens, ctx.dt.act, ctx.dt.resid
    fsdp = _Fsdp(prog, weights.units, ctx.shards) if ctx.shards > 1 else None
    root = spec.layers  # the root's FSDP unit
    ddp = DdpBuckets(prog, sum(t.nbytes for t in trainable)) if w.shard == "ddp" and trainable else None
    # one cuBLAS workspace for the forward's handle, and one for the autograd thread's, made by backward's first
    # matmul (after that matmul's output): the recorded history of qwen2.5-0.5b (ddp_qwen05, rank 0) places it in
    # a freed fp32-logits block, which splits it, and the next step's logits need a segment of their own
    # (qwen2.5-0.5b full, 8 x 1024: 27.90 GiB predicted with both made up front, 32.52 measured)
    prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
    backward_workspace = True
    state: list[int] | None = None
    for step in range(STEPS):
        grads: list[int] = []
        if step == 1 and ddp:
            ddp.rebuild([t.nbytes for t in reversed(trainable)], release_first=w.grad_ckpt)
        for micro in range(min(w.grad_accum, 2)):
            accumulate = micro > 0
            prog.set_phase("forward")
            # autocast caches a bf16 copy of each weight for the duration of the autocast region. Under
            # checkpointing the layers' copies are not cached (each layer casts again in its forward and its
            # recompute) and only lm_head's stays: the recorded history of llama-3.2-1b mixed with checkpointing
            # holds one vocab x hidden bf16 copy at the peak, not the layers' (docs/calibration/histories)
            layer_casts = cast_bytes if ctx.dt.autocast and w.grad_ckpt else 0
            if ctx.dt.autocast:
                kept_casts = spec.vocab * h * 2 if w.grad_ckpt else cast_bytes
                casts = prog.alloc("autocast_weight_copies", kept_casts)
            else:
                casts = 0
            if fsdp:
                fsdp.gather(root)
            x = prog.alloc("activations", T * h * r)  # embedding output, the residual stream
            per_layer: list[list[Saved]] = []
            ckpt_inputs: list[int] = []
            for layer in range(spec.layers):
                if fsdp:
                    fsdp.gather(layer)
                if w.grad_ckpt:
                    # non-reentrant checkpointing keeps each layer's input and recomputes the rest in backward
                    ckpt_inputs.append(x)
                    copies = prog.alloc("autocast_weight_copies", layer_casts // spec.layers) if layer_casts else 0
                    x, _ = block_nograd(prog, ctx, x, layer, cache_kv=False, keep_input=True)
                    prog.free(copies)
                    per_layer.append([])
                else:
                    per_layer.append(block_forward(prog, ctx, layer, keep=True))
                if fsdp:
                    fsdp.reshard(layer)
            if _recorded_layer_order(ctx, spec.layers - 1) and spec.model_type != "gemma2":
                final, x = final_norm_forward(prog, ctx, x)
            else:
                final = [prog.alloc("activations", T * h * 4)]  # final norm keeps its fp32 input
                if ctx.full:
                    final.append(prog.alloc("activations", T * h * e))  # lm_head keeps its input
            kept = logits_and_loss_forward(prog, ctx)
            prog.set_phase("backward")
            g = logits_and_loss_backward(prog, ctx, kept)
            if step == 1 and micro == 0 and ddp:
                ddp.release_first()
            root_grads: list[int] = []
            lm_head_grad = 0
            if ctx.full:
                lm_head = prog.alloc("gradients", spec.vocab * h * ctx.dt.param)
                if backward_workspace:
                    prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
                    backward_workspace = False
                if fsdp:
                    root_grads.append(lm_head)
                elif accumulate:
                    prog.free(lm_head)
                else:
                    grads.append(lm_head)
                    lm_head_grad = lm_head
            if fsdp:
                fsdp.finish()  # the last layer's all-gather buffer
                fsdp.prefetch(spec.layers - 1)
            dx = prog.alloc("activations", T * h * e)
            if backward_workspace:
                prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
                backward_workspace = False
            prog.free(g)
            prog.free_all(final)
            prog.free(x)
            for layer in reversed(range(spec.layers)):
                if fsdp:
                    fsdp.copy_out(layer)
                    if layer > 0:
                        fsdp.prefetch(layer - 1)
                saved = per_layer[layer]
                copies = 0
                if w.grad_ckpt:
                    copies = prog.alloc("autocast_weight_copies", layer_casts // spec.layers) if layer_casts else 0
                    saved = block_forward(prog, ctx, layer, keep=True)  # recomputed for its backward
                if fsdp:
                    full: list[int] = []
                    block_backward(prog, saved, full, False)
                    prog.free(copies)
                    if w.grad_ckpt:
                        prog.free(ckpt_inputs[layer])
                    fsdp.reshard(layer)
                    nbytes = sum(weights.units[layer]) if ctx.full else _sum_sizes(prog, full)
                    shard = fsdp.reduce_scatter(nbytes, full, accumulate)
                    if shard:
                        grads.append(shard)
                    continue
                block_backward(prog, saved, grads, accumulate)
                prog.free(copies)
                if w.grad_ckpt:
                    prog.free(ckpt_inputs[layer])
            prog.free(dx)
            if ctx.full:
                # embedding_dense_backward builds a full vocab x hidden gradient. With tied embeddings the shared
                # weight's .grad becomes lm_head's gradient plus this one, a third tensor, and both go (every tied
                # model's recorded history: ft_qwen15_bf16, ft_qwen3_4b, ft_gemma2b_bf16)
                emb = prog.alloc("gradients", spec.vocab * h * ctx.dt.param)
                if fsdp and not spec.tied:
                    root_grads.append(emb)
                elif spec.tied and not fsdp and not accumulate and lm_head_grad:
                    total = prog.alloc("gradients", spec.vocab * h * ctx.dt.param)
                    grads.remove(lm_head_grad)
                    prog.free(lm_head_grad)
                    prog.free(emb)
                    grads.append(total)
                elif spec.tied or accumulate:
                    prog.free(emb)
                else:
                    grads.append(emb)
            elif not accumulate and not fsdp:
                grads.extend(prog.alloc("gradients", t.nbytes) for t in trainable)
            if fsdp:
                if ctx.full:
                    shard = fsdp.reduce_scatter(sum(weights.units[root]), root_grads, accumulate)
                    if shard:
                        grads.append(shard)
                fsdp.reshard(root)
                fsdp.finish()
            prog.free(casts)
        prog.set_phase("optimizer step")
        if ctx.full or fsdp:
            # norms, biases and routers get their (small) gradients along the way
            rest = sum(t.nbytes for t in trainable) - _sum_sizes(prog, grads)
            if rest > 0:
                grads.append(prog.alloc("gradients", rest))
        state = optimizer_step(prog, w.optim, trainable, state)
        prog.set_phase("forward")
        prog.free_all(grads)
    return prog


def _sum_sizes(prog: Program, handles: list[int]) -> int:
    return sum(prog.size_of(h) for h in handles)


def decode_lengths(steps: int) -> list[int]:
    """Tokens added to the cache by the end of each simulated decode step: every step up to DECODE_EXACT, then
    DECODE_COARSE evenly spaced lengths ending at `steps` (each such step grows the cache by several tokens)."""
    if steps <= DECODE_EXACT:
        return list(range(1, steps + 1))
    rest = steps - DECODE_EXACT
    coarse = min(rest, DECODE_COARSE)
    return list(range(1, DECODE_EXACT + 1)) + [DECODE_EXACT + -(-k * rest // coarse) for k in range(1, coarse + 1)]


def infer_program(spec: ModelSpec, w: Workload) -> Program:
    """generate() (prefill, then one token per step into a DynamicCache grown by torch.cat), or with
    --new-tokens 0 two plain forward passes with use_cache=True over the prompt."""
    ctx = make_ctx(spec, w)
    prog = Program()
    load_weights(prog, ctx)
    workspace = False
    h, e, B, S, V = spec.hidden, ctx.dt.act, w.batch, w.seq, spec.vocab
    kv_tok = spec.kv_bytes_per_token_per_layer_elems * e // 2  # bytes per K (or V), per token, per layer

    def window(tokens: int, layer: int) -> int:
        # sliding-window layers keep only the window (transformers' DynamicSlidingWindowLayer)
        if spec.sliding_window and layer < spec.sliding_layers:
            return min(tokens, spec.sliding_window)
        return tokens

    for _rep in range(1 if w.new_tokens else 2):
        prog.set_phase("prefill")
        # the model's forward keeps `inputs_embeds` referenced for the whole pass
        embeds = prog.alloc("activations", B * S * h * ctx.dt.resid)
        x = embeds
        tables = rotary_tables(prog, ctx, B, S, first_matmul=not workspace)
        workspace = True
        mask = eager_mask(prog, ctx, B, S)
        cache: list[int] = []
        for layer in range(spec.layers):
            # a sliding-window layer keeps the whole prompt's K and V through the prefill: transformers'
            # DynamicSlidingWindowLayer stores `full[:, :, -window + 1:]`, a view that holds the whole tensor until
            # the first decode step's torch.cat makes a window-sized one (transformers cache_utils.py)
            x, kv = block_nograd(prog, ctx, x, layer, cache_kv=True, keep_input=layer == 0)
            cache.extend(kv)
        if spec.model_type == "gpt2":
            normed = prog.alloc("activations", B * S * h * ctx.dt.resid)
        else:
            normed = rms_norm_nograd(prog, B * S, h, ctx.dt.resid, gemma=spec.model_type == "gemma3_text")
        prog.free(x)
        # the base model returns: its input embeddings, mask and rotary tables go before lm_head runs
        prog.free(embeds)
        prog.free(mask)
        prog.free_all(tables)
        if w.new_tokens == 0:
            logits = prog.alloc("logits_and_loss", B * S * V * e)  # every position's logits
            prog.free(normed)
            prog.free(logits)
            prog.free_all(cache)
            continue
        sampler = Sampler(prog, B, V, e)
        sampler.step()  # generate asks for the last position's logits only
        prog.free(normed)
        prog.set_phase("decode")
        decode = make_ctx(spec, w.model_copy(update={"seq": 1}))
        # every step grows each layer's K and V by one token (torch.cat makes the longer tensor, then the old one
        # goes): these large-pool allocations drive the allocator, so they are replayed step by step; a step's own
        # activations (batch x width, mostly small-pool) are simulated on the first and the last step. Past
        # DECODE_EXACT steps, each simulated step stands for several tokens (the cache grows by as many at once),
        # so that any --new-tokens costs at most DECODE_EXACT + DECODE_COARSE steps; the last ends at full length
        steps = decode_lengths(w.new_tokens - 1)
        for i, step in enumerate(steps):
            t = S + step
            full_step = i in (0, len(steps) - 1)
            x = prog.alloc("activations", B * h * ctx.dt.resid) if full_step else 0
            for layer in range(spec.layers):
                if full_step:
                    x, _ = block_nograd(prog, decode, x, layer, cache_kv=False)
                for i in (0, 1):
                    old = cache[2 * layer + i]
                    cache[2 * layer + i] = prog.alloc("kv_cache", B * window(t, layer) * kv_tok)
                    prog.free(old)
            prog.free(x)
            sampler.step()
        sampler.finish()
        prog.free_all(cache)
    return prog
