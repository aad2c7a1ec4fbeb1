"""One decoder layer's forward under autograd (training): the recorded order where it is known
(blocks_recorded.py), else the generic layer of every family.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuready.memory.lm import nf4
from gpuready.memory.lm.autograd import Layer, Saved
from gpuready.memory.lm.blocks_gpt2 import gpt2_block_forward, gpt2_block_forward_autocast
from gpuready.memory.lm.blocks_recorded import plain_block_forward, recorded_layer_order
from gpuready.memory.lm.context import (
    GEMMA_FAMILY,
    Ctx,
    layer_linears,
    layer_lora,
    masked_attention,
    mlp_width,
    softmax_upcast_copy,
)
from gpuready.memory.lm.moe import EXPERTS_INTERFACE_TYPES, grouped_experts_forward, llama4_experts_forward
from gpuready.memory.lm.ops import rms_norm_frozen, rms_norm_start, rope
from gpuready.memory.program import Program
from gpuready.models.spec import Linear


def block_forward(
    prog: Program,
    ctx: Ctx,
    layer: int,
    keep: bool,
    residual_out: list[int] | None = None,
    recompute: bool = False,
) -> list[Saved]:
    """One decoder layer's forward over ctx.tokens tokens. With keep=False (no_grad, or recomputed later by
    checkpointing) nothing is saved and only the transient peak is simulated. `recompute`: checkpointing's
    recompute of the layer for its backward (on the recorded layer: stopped early, plain_block_forward)."""
    if recorded_layer_order(ctx, layer):
        return plain_block_forward(prog, ctx, layer, keep, residual_out, stop_early=recompute)
    if (
        ctx.spec.model_type == "gpt2"
        and ctx.full
        and not ctx.dt.autocast
        and ctx.backend in ("flash", "efficient")
        and ctx.w.task == "train"
    ):
        if ctx.dt.autocast16 and keep:
            return gpt2_block_forward_autocast(prog, ctx, residual_out)
        return gpt2_block_forward(prog, ctx, keep)
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, a, kv, d = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    e, r = dt.act, dt.resid
    full = ctx.full
    layer_ = Layer(prog, keep)
    save, tmp, drop = layer_.save, layer_.tmp, layer_.drop
    adapted = layer_lora(ctx, layer)
    # Gemma's RMSNorm multiplies the fp32 y by (1 + weight) and keeps that y for the weight's gradient (Gemma 3's
    # too: the recorded history h27_gemma3_1b_bf16_b4, its four norms and its q/k norms; kept in 16 bits before,
    # gemma-3-1b full bf16 4 x 1024 came out -2.5% allocated)
    fp32_y = spec.model_type in GEMMA_FAMILY

    def norm(feeds_linear: bool = True) -> int:
        """RMSNorm as LlamaRMSNorm runs it: x.to(fp32) (kept by pow; in fp32 runs the input itself), pow,
        mean, rsqrt (kept), x * rsqrt in fp32, .to(dtype) (kept by weight * y when the weight trains), then
        weight * y. Gemma2RMSNorm keeps the fp32 y instead. LayerNorm keeps its input. Returns the output's
        handle: kept when the projections that read it keep it, else a temporary dropped after them (always for
        Gemma's post-attention and post-feedforward norms, `feeds_linear` False: a residual add reads their
        output, h27_gemma3_1b_bf16_b4). Backward of the fp32 norm holds about three fp32 temporaries of the
        input's size."""
        if spec.norm == "layer":
            save(T * h * r, T * h * e)
        else:
            y32 = rms_norm_start(layer_, T, h, e)
            if not full:
                return layer_.temp(rms_norm_frozen(layer_, y32, T, h, r))
            save(T * h * (4 if fp32_y else r))
            out = tmp(T * h * r) if dt.autocast else 0
            prog.free(y32)
            if out:
                return out
        if full and not dt.autocast and feeds_linear:
            save(T * h * e)  # the norm output, kept (once) by the projections that read it
            return 0
        return tmp(T * h * r)

    def weight_copy(lin: Linear) -> None:
        """Autocast over fp32 weights: the linear's bf16 copy of its weight, made when it first runs (autocast
        caches it for the region when the weight trains) and kept by the matmul until its backward (the recorded
        H200 history h24_phi3_mixed: each of qkv_proj's, o_proj's, gate_up_proj's and down_proj's copies made
        before its input's cast, freed at its backward; made as one block per step before, phi-3-mini full
        mixed at 2 x 1024 was sized +6.0% on the reserve, allocated exact). A frozen weight's copy (LoRA) is not
        cached but the matmul keeps it for its input's gradient all the same (h28_lora_llama1b_mixed_b4)."""
        if dt.autocast and layer_.keep:
            numel = lin.in_features * lin.out_features * lin.count
            layer_.keep_handle(prog.alloc("autocast_weight_copies", numel * 2))

    def linear_in(lin: Linear, width: int, shared: bool, cast: bool = True) -> None:
        """What a linear keeps of its input: the input when the weight trains (once per shared input; autocast
        makes and keeps a bf16 copy per call of an fp32 input, `cast`), and peft's fp32 copy of the input for an
        adapter."""
        w_grad = lin.in_features * lin.out_features * lin.count * dt.param
        if ctx.w.method == "qlora":
            # bitsandbytes MatMul4Bit dequantizes the NF4 weight to the compute dtype for each matmul
            prog.transient("quantization_temporaries", lin.in_features * lin.out_features * e)
        weight_copy(lin)
        if full and ((dt.autocast and cast) or not shared):
            save(T * width * e, 0, (w_grad,))
        elif full:
            # the shared input is already kept (once, by the norm): this node only makes the weight's gradient
            layer_.weight_grad(w_grad)
        if lin.name in adapted:
            # peft's Linear.forward: x cast to the adapter's fp32 (kept by lora_A), lora_A's output (kept by
            # lora_B), then lora_B's output, its product with the scaling and the sum with the base output, all
            # in fp32 before the result is cast back; backward makes fp32 gradients of the same sizes
            # (under autocast the fp32 x is cast back to 16 bits for lora_A, which keeps that copy; over 16-bit
            # weights the branch then runs in 16 bits, blocks_recorded.project_autocast)
            # (16-bit adapters keep the input itself: sized as a kept copy, a little over)
            # (under autocast over fp32 weights too: lora_A and lora_B run in bf16, so A's output, B's, the scaled
            # update and the sum are bf16, h28_lora_llama1b_mixed_b4 and h45_lora_mixed_qwen3_4b_b4: 152 MiB blocks
            # at 4 x 2048 for qwen3-4b's MLP, 304 when they were sized fp32)
            half = dt.autocast or dt.autocast16 or dt.lora16
            out = T * lin.out_features * (e if half else 4)
            save(T * width * (2 if half else 4), 0, (), (out, T * width * 4))
            save(T * ctx.w.lora_r * (e if half else 4), 0, ())
            prog.transient("activations", out, out)

    lins = {lin.name: lin for lin in layer_linears(spec, layer)}
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
        # kv_a output (compressed latent) -> RMSNorm -> kv_b_proj -> per-head K_nope and V; kv_a_layernorm
        # normalizes the latent's kv_lora_rank part, split from the rotary part (h55_qlora_deepseekv2lite_b2)
        save(T * spec.kv_lora_rank * 4, T * spec.kv_lora_rank * e)
        linear_in(lins["kv_b_proj"], spec.kv_lora_rank, False)
        k_width = a * (spec.qk_nope_dim + spec.qk_rope_dim)
        v_width = a * spec.v_head_dim
    else:
        k_width = v_width = kv_width
    if spec.qk_norm:
        save(T * (q_width + k_width) * 4, T * (q_width + k_width) * e)
        if full:
            # the norms' weights train: Qwen3's `weight * y.to(dtype)` keeps the 16-bit y of q and of k (the recorded
            # history h26_qwen3_06b_mixed_b8: 64 + 32 MiB a layer at 8 x 2048; -3.8% allocated without them),
            # Gemma 3's `y * (1 + weight)` its fp32 y
            save(T * (q_width + k_width) * (4 if fp32_y else e))
    # the projections' q and k outputs live until RoPE has made its own (mul keeps only cos and sin)
    q_out, k_out = tmp(T * q_width * e), tmp(T * k_width * e)
    if normed:
        drop(normed)
    if spec.model_type != "gpt2":
        rope(prog, T, q_width, e, output=False)
        rope(prog, T, k_width, e, output=False)
    out_width = a * (spec.v_head_dim or d)
    backend = ctx.backend
    # with a mask transformers repeats K and V to every head (one K/V head included: without autograd that is a
    # stride-0 view, h48_gen_gemma3_1b_b16_s4096; in training the history h27_gemma3_1b_bf16_b4 keeps the mask's
    # copy instead, as large: counted as K/V copies here)
    expanded = backend in ("eager", "efficient") and ctx.mask and k_width < q_width
    kq = q_width if (expanded or (backend == "eager" and k_width < q_width)) else k_width
    vq = out_width if (expanded or (backend == "eager" and v_width < out_width)) else v_width
    drop(q_out)
    drop(k_out)
    if backend in ("flash", "efficient"):
        if masked_attention(backend, ctx.mask, spec, layer) and spec.kv_heads > 1:
            # SDPA converts the boolean sliding-window mask to the query's dtype ([B, 1, S, S]) for the
            # memory-efficient kernel, which keeps it for its backward: one per layer (mistral-7b LoRA 1 x 4096
            # allocated -1.7% without it, and with checkpointing two at the recomputed layer's peak: -1.2%, -0.6%).
            # With one K/V head (gemma-3-1b) the history h27_gemma3_1b_bf16_b4 keeps as much as the K/V copies the
            # layer counts instead (no copies there, but the mask and the output): not counted twice
            save(T * ctx.w.seq * e)
        save(T * q_width * e, T * q_width * e)  # q after RoPE
        save(T * kq * e, T * kq * e)
        # v; a fused qkv_proj (phi-3) hands attention a view of its output, which keeps all of it alive (the
        # recorded H200 history of phi-3-mini LoRA: 36 MiB per layer at 2048 tokens, not 12)
        fused_v = ("qkv_proj" in lins or "query_key_value" in lins) and vq == v_width
        # MLA: V is split off kv_b_proj's output with K's no-RoPE part, a view that keeps all of it (the recorded
        # history lora_deepseek3_4l: 256 MiB a layer at 2 x 2048, not 128)
        kept_v = (
            q_width + k_width + v_width if fused_v else a * (spec.qk_nope_dim + spec.v_head_dim) if spec.mla else vq
        )
        save(T * kept_v * e, T * vq * e)
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
            # Backward as the recorded H200 history h44_lora_qwen7b_eager_ckpt_b2_cap40 runs it (bf16): the
            # probabilities' gradient (bf16) is cast to fp32 (.to's backward), softmax's backward makes its fp32
            # gradient and a score-sized fp32 scratch with the cast still alive (three fp32 score tensors at once:
            # with one, batch 2 on a 40 GiB card was predicted to fit and failed there), the fp32 copy's backward
            # casts it back to bf16 and `* scaling`'s makes one more bf16 gradient before q @ kᵀ's backward
            save(T * q_width * e)
            save(T * kq * e, T * kq * e)
            layer_.grad_node(scores * e)  # `* scaling`
            t = tmp(scores * e)
            t2 = tmp(scores * e)
            drop(t)
            if spec.attn_softcap:
                # Gemma 2 (modeling_gemma2.eager_attention_forward): / cap, tanh (its output kept for its backward),
                # * cap; each a new score-sized tensor, the one before dropped
                layer_.grad_node(scores * e)  # / cap
                d = tmp(scores * e)
                drop(t2)
                save(scores * e, scores * e)  # tanh
                drop(d)
                layer_.grad_node(scores * e)  # * cap
                t2 = tmp(scores * e)
            t3 = tmp(scores * e)
            drop(t2)
            upcast = softmax_upcast_copy(ctx)  # softmax's fp32 copy of a bf16 input
            if upcast:
                layer_.grad_node(scores * e)  # the copy's backward: the gradient cast back to bf16
            up = tmp(scores * 4) if upcast else 0
            if e == 4:  # fp32: softmax's output is the probabilities (`.to(float32)` is no copy)
                drop(t3)
                save(scores * 4, scores * 4, transient_after=(scores * 4,))
            else:
                # fp16's fused half-to-float softmax returns its gradient in fp16 (no scratch recorded)
                save(scores * 4, scores * (4 if upcast else e), transient_after=(scores * 4,) if upcast else ())
                if up:
                    drop(up)
                drop(t3)
                layer_.grad_node(scores * 4)  # .to(dtype)'s backward: the probabilities' gradient cast to fp32
                save(scores * e, scores * e)
            save(T * vq * e)
        save(T * out_width * e)  # transpose(1, 2).contiguous() for o_proj
    o = lins.get("o_proj") or lins.get("c_proj") or lins.get("dense")
    if o is not None:
        # attention's output is already bf16 under autocast: o_proj keeps it, no copy (the recorded histories
        # h24_phi3_mixed, h25_llama1b_mixed_b3 and h25_gpt2m_mixed_b16: o_proj's weight copy, then its output)
        linear_in(o, out_width, True, cast=False)
    o_out = tmp(T * h * e)
    resid = tmp(T * h * r)  # residual + attention output
    drop(o_out)
    if spec.model_type == "gpt2" and ctx.w.task == "train":
        save(T * h)  # resid_pdrop dropout keeps a bool mask
    for _ in range(min(1, spec.norms_per_layer - 2)):
        # Gemma 2/3's post-attention norm (pre_feedforward_layernorm is the MLP's norm below, and
        # post_feedforward_layernorm follows the MLP); one, not two: with two the layer kept a fifth norm's input
        # and output (the recorded history h26_gemma2_2b_mixed_b2: +2.4% allocated)
        extra = norm(feeds_linear=False)
        if extra:
            drop(extra)
    # --- MLP
    normed = norm()
    width, fan = mlp_width(spec, layer)
    Tm = T * fan
    if (
        spec.experts
        and layer >= spec.dense_layers
        and (spec.model_type == "llama4_text" or spec.model_type in EXPERTS_INTERFACE_TYPES)
    ):
        _moe_forward(layer_, ctx, linear_in, normed)
        down_out = tmp(T * h * e)
        tmp(T * h * r)  # the layer's output, residual + MLP output (dropped with the other temporaries below)
        drop(down_out)
        drop(resid)
        return layer_.finish()
    gelu_product = 0
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
    elif dt.autocast:
        # gelu_new under autocast (the recorded history h25_gpt2m_mixed_b16): pow is on autocast's fp32 list, so it
        # casts c_fc's bf16 output x to fp32 and keeps that copy, and everything after it is fp32; kept are 0.5*x
        # (bf16), x's fp32 copy, tanh(...) and 1+tanh(...); x itself goes when the MLP's forward drops it, after
        # the fp32 product is made, and the product once c_proj has cast it back to bf16 (held-out set 25: with x
        # kept in bf16 instead of its fp32 copy, gpt2-medium at 16 x 1024 was -5.0% allocated)
        n = Tm * width
        x_out = tmp(n * e)
        save(n * e)  # 0.5 * x
        save(n * 4, n * e)  # pow's fp32 copy of x
        pow_out = tmp(n * 4)
        scaled = tmp(n * 4)
        drop(pow_out)
        inner = tmp(n * 4)
        drop(scaled)
        arg = tmp(n * 4)
        drop(inner)
        save(n * 4)  # tanh(...)
        drop(arg)
        save(n * 4)  # 1 + tanh(...)
        gelu_product = tmp(n * 4)
        drop(x_out)
    else:  # gpt2's gelu_new is written out in Python: x, tanh(...), 0.5*x and 1+tanh(...) are kept
        save(Tm * width * e, Tm * width * e)
        save(Tm * width * e)
        save(Tm * width * e)
        save(Tm * width * e)
    down = lins.get("down_proj") or lins.get("mlp.c_proj") or lins.get("dense_4h_to_h")
    if down is not None:
        lin = Linear(down.name, down.in_features, down.out_features, down.bias, 1)
        if full:
            weight_copy(down)
            save(Tm * width * e, 0, (down.in_features * down.out_features * down.count * dt.param,))
        elif down.name in adapted:
            linear_in(lin, width, False)  # (its weight's copy too)
        else:
            weight_copy(down)
    if gelu_product:
        drop(gelu_product)
    if spec.shared_intermediate and layer >= spec.dense_layers:
        s = spec.shared_intermediate
        for _ in range(4):
            save(T * s * e, T * s * e)
    if spec.model_type == "gpt2" and ctx.w.task == "train":
        save(T * h)
    for _ in range(spec.norms_per_layer - 2 - 1):
        extra = norm(feeds_linear=False)
        if extra:
            drop(extra)
    down_out = tmp(T * h * e)
    tmp(T * h * r)  # the layer's output, residual + MLP output (dropped with the other temporaries below)
    drop(down_out)
    drop(resid)
    return layer_.finish()


def _shared_expert(layer_: Layer, ctx: Ctx, linear_in: Callable[[Linear, int, bool], None]) -> int:
    """The shared expert (a gated MLP on the layer's normed input) under autograd; returns its output's handle (not
    one of the layer's temporaries: the caller keeps it or takes it as one)."""
    spec, T, e = ctx.spec, ctx.tokens, ctx.dt.act
    s, h = spec.shared_intermediate, spec.hidden
    shared = {lin.name.split(".")[-1]: lin for lin in spec.block_linears if lin.name.startswith("shared_expert")}
    frozen = not {lin.name for lin in shared.values()} & ctx.lora
    if ctx.w.method == "qlora" and frozen and "down_proj" in shared:
        # frozen 4-bit linears (peft's expert conversion leaves DeepSeek's shared expert without adapters), each
        # weight dequantized while its output is made (nf4.forward_output), in the order the module runs them:
        # gate, silu, up, the product (down_proj's input: frozen, not kept), down (h55_qlora_deepseekv2lite_b2)
        def frozen_out(name: str, out_bytes: int) -> int:
            lin = shared[name]
            return nf4.forward_output(layer_.prog, lin.in_features * lin.out_features, e, out_bytes)

        layer_.keep_handle(frozen_out("gate_proj", T * s * e), T * s * e)  # kept by the activation
        layer_.save(T * s * e, T * s * e)  # the activation, kept by the product
        layer_.keep_handle(frozen_out("up_proj", T * s * e), T * s * e, (), (T * s * e,))  # kept by the product
        product = layer_.alloc(T * s * e)
        out = frozen_out("down_proj", T * h * e)
        layer_.prog.free(product)
        return out
    linear_in(shared["gate_proj"], h, True)
    linear_in(shared["up_proj"], h, True)
    layer_.save(T * s * e, T * s * e)  # gate output, kept by the activation
    layer_.save(T * s * e, T * s * e)  # the activation, kept by the product
    layer_.save(T * s * e, T * s * e, (), (T * s * e,))  # up output, kept by the product
    down = shared["down_proj"]
    if ctx.full:
        layer_.save(T * s * e, 0, (down.in_features * down.out_features * ctx.dt.param,))
    elif down.name in ctx.lora:
        linear_in(down, s, False)
    return layer_.alloc(T * h * e)


def _router(layer_: Layer, ctx: Ctx) -> None:
    """A top-k router under autograd: its logits (returned, alive until the block returns), the softmax in fp32
    (kept for its backward) and top-k's indices (kept)."""
    spec, T, e = ctx.spec, ctx.tokens, ctx.dt.act
    layer_.tmp(T * spec.experts * e)
    layer_.save(T * spec.experts * 4, T * spec.experts * 4)
    layer_.save(T * spec.experts_per_token * 8, T * spec.experts * 4)
    layer_.prog.transient("activations", T * spec.experts_per_token * 4)


def _moe_forward(layer_: Layer, ctx: Ctx, linear_in: Callable[[Linear, int, bool], None], normed: int) -> None:
    """An MoE layer's MLP under autograd: the routed experts as transformers runs them (lm/moe.py), then the
    shared expert (a gated MLP on the same normed input: its linears keep what peft's LoRA or full fine-tuning
    needs; under peft's expert conversion they are frozen), the two outputs added. Qwen2-MoE runs its shared expert
    first, then the router (its fp32 softmax and top-k indices kept) and the routed experts, then
    `sigmoid(shared_expert_gate(x)) * shared_output` (shared_expert_gate's adapter keeps its fp32 input, the product
    keeps the shared output), then the sum (history h46_lora_qwen15moe_b4: -2.1% allocated without these)."""
    spec, T, e = ctx.spec, ctx.tokens, ctx.dt.act
    h = spec.hidden
    ends: list[int] = []
    qwen2 = spec.model_type == "qwen2_moe" and bool(spec.shared_intermediate)
    shared_out = 0
    if qwen2:
        shared_out = _shared_expert(layer_, ctx, linear_in)
        _router(layer_, ctx)
    if spec.model_type == "llama4_text":
        routed, ends = llama4_experts_forward(layer_, ctx)
    else:
        routed = grouped_experts_forward(layer_, ctx, ctx.expert_lora)
    out = 0
    if qwen2:
        gate = next(lin for lin in spec.block_linears if lin.name == "shared_expert_gate")
        linear_in(gate, h, True)
        gated = layer_.tmp(T * h * e)  # sigmoid(gate) * shared output, which the product keeps
        layer_.keep_handle(shared_out, T * h * e)
        out = layer_.tmp(T * h * e)  # routed + gated
        layer_.drop(routed)
        layer_.drop(gated)
        routed = 0
    elif spec.shared_intermediate:
        out = layer_.temp(_shared_expert(layer_, ctx, linear_in))
        if spec.model_type == "llama4_text":
            # out.add_(routed_out.reshape(E, T, h).sum(dim=0)): the sum's fp32 accumulation and its bf16 result
            layer_.prog.transient("activations", T * h * e, T * h * 4)
        else:
            total = layer_.tmp(T * h * e)  # routed + shared_experts(residuals)
            layer_.drop(out)
            out = total
    for handle in [routed, *ends]:
        if handle:
            layer_.drop(handle)
    if normed:
        layer_.drop(normed)
    if out:
        layer_.drop(out)
