"""Decoder layers under autograd in the order recorded H200 allocator histories show (plain decoder layers; GPT-2's
block: blocks_gpt2.py)."""

from __future__ import annotations

from gpuready.memory.lm import nf4
from gpuready.memory.lm.autograd import Layer, Saved
from gpuready.memory.lm.context import GEMMA_NORMS, Ctx, masked_attention
from gpuready.memory.lm.eager import eager_attention_train
from gpuready.memory.lm.ops import lora_update, rms_norm_frozen, rms_norm_start, rope
from gpuready.memory.program import Program


def recorded_layer_order(ctx: Ctx, layer: int) -> bool:
    """Whether this layer's forward can follow the order recorded on the GPU (plain_block_forward): a plain
    decoder layer (RMSNorm, separate or fused q/k/v, gated MLP, flash, memory-efficient (past a sliding window: the
    mask's copy and K/V repeated) or fp32 math attention) trained in 16 bits (full, LoRA or QLoRA) or fp32 (full);
    Gemma 2's and Gemma 3's four norms (and Gemma 3's head norms) in 16 bits."""
    spec, lins = ctx.spec, {lin.name for lin in ctx.spec.block_linears}
    attn = {"q_proj", "k_proj", "v_proj"} <= lins or "qkv_proj" in lins
    mlp = {"gate_proj", "up_proj"} <= lins or "gate_up_proj" in lins
    return (
        ctx.w.method in ("lora", "qlora", "full")
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
        and (
            ctx.backend in ("flash", "efficient")
            or (ctx.backend == "math" and ctx.dt.act == 4)
            # eager attention as recorded in a checkpointed layer's recompute (h45_eager_ckpt_qwen15b_b2: -5.2% ->
            # -0.1%) and under LoRA (h47_lora_llama1b_eager_b1: forward identical to the GPU's; the four LoRA eager
            # rows +2.0 ... -0.0% -> +0.1 ... -0.0%), Gemma 2's soft-capping included (h47_lora_gemma2b_eager_b2). Full
            # fine-tuning without checkpointing keeps the generic layer, which its history matches to the segment
            # (h46_eager_full_qwen15b_b2: -0.0%; +5.3% on this layer, one logits segment more in the second step,
            # with the matmuls' two-gradient backward too: not found).
            or (ctx.backend == "eager" and ctx.dt.act == 2 and (ctx.w.grad_ckpt or not ctx.full))
        )
        and attn
        and mlp
        and "o_proj" in lins
        and "down_proj" in lins
    )


def plain_block_forward(
    prog: Program,
    ctx: Ctx,
    layer: int,
    keep: bool,
    residual_out: list[int] | None = None,
    named: dict[str, int] | None = None,
    stop_early: bool = False,
    input_grad: bool = True,
) -> list[Saved]:
    """A plain decoder layer's forward (16-bit full or LoRA, fp32 full) in the order the recorded H200 histories
    show it (docs/calibration/histories: lora_llama8b_b1 for LoRA, ft_qwen15_bf16 for 16-bit and ft_qwen05_fp32
    for fp32 full fine-tuning). Under full fine-tuning the norm outputs, the attention output and the MLP product
    are kept for the weight gradients; in fp32 the residual stream is kept too (the next norm's pow keeps its input,
    no fp32 copy being made). Under LoRA, per adapted linear as peft's lora.Linear.forward runs it:
    the base output; x cast to fp32 (kept by lora_A); lora_A's output (kept by lora_B); lora_B's output, times the
    scaling, plus the base output, in fp32, each freeing the one before; the sum cast back (the linear's output).
    Attention keeps the RoPE'd q and k, v (the v projection's own output, or the whole fused qkv output it is a
    view of), its output and log-sum-exp; the norm's output lives until the attention or MLP returns.

    `named` (LoRA, lora_recorded.py): filled with the kept handles by name for the recorded backward. `stop_early`:
    the recompute of a checkpointed LoRA layer, which stops once down_proj's lora_A output is made (non-reentrant
    checkpointing's early stop, torch/utils/checkpoint.py): then down_proj's base output, the MLP product, the norm's
    output and the mid-layer residual go as the frames unwind (the recorded history qwen3_8b_lora_ckpt_s2048_b5_cap40)
    and the layer's output is never made. `input_grad` False: the layer's input needs no gradient (the first layer
    under LoRA without checkpointing: the embedding output does not require grad), so its norm keeps nothing: the
    fp32 copy goes once x * rsqrt is made (lora_qwen3b_s1024_b2_cap24)."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, a, kv, d = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    e, r, rank = dt.act, dt.resid, ctx.w.lora_r
    full = ctx.full
    fp32 = e == 4
    quantized = ctx.w.method == "qlora"
    lora16 = dt.lora16 and not full  # adapters in 16 bits: lora_A keeps its input itself (no fp32 copy)
    all_lins = {lin.name: lin for lin in spec.block_linears}
    lins = set(all_lins)
    layer_ = Layer(prog, keep)
    alloc, save, save_handle = layer_.alloc, layer_.save, layer_.keep_handle
    names: dict[str, int] = named if named is not None else {}

    def last_kept() -> int:
        return layer_.saved[-1].handle if keep else 0

    def norm() -> int:
        """The norm's output handle: a temporary under LoRA; under full fine-tuning it is kept (by the
        projections that read it, whose weights train) and 0 is returned."""
        if fp32:
            # x.to(fp32) is x itself: the residual stream, kept by pow (the residual adds below are saved)
            prog.free(alloc(T * h * 4))  # x ** 2
            save(T * h * 4, T * h * e, transient=(T * h * 4,) * 3)  # x * rsqrt, kept by weight * y
            save(T * h * 4)  # weight * y, kept by the projections
            return 0
        y32 = rms_norm_start(layer_, T, h, e)  # x.to(fp32) kept by pow, pow, x * rsqrt
        first = "in.x32" not in names
        names["in.x32" if first else "post.x32"] = layer_.saved[-1].handle if keep else 0
        if first and keep and not input_grad:
            prog.free(layer_.saved.pop().handle)
            names["in.x32"] = 0
        if full:
            save(T * h * r)  # .to(dtype), kept by weight * y since the weight trains
            save(T * h * r)  # weight * y, kept by the projections
            prog.free(y32)
            return 0
        return rms_norm_frozen(layer_, y32, T, h, r)

    def gemma_norm(src: int = 0, feeds_linears: bool = False, width: int = 0, head: bool = False) -> int:
        """Gemma2RMSNorm / Gemma3RMSNorm as the recorded histories of gemma-2-2b (LoRA and full fine-tuning) and
        gemma-3-1b (h50_ft_gemma3_1b_b4) show it: x.float() (kept by pow), pow, x * rsqrt (kept when the weight
        trains), * (1 + weight) in fp32, .type_as(x) (the output, kept under full fine-tuning when linears read it).
        `src` (a projection's output) is freed once the norm is done. `head`: Gemma 3's q_norm or k_norm over each
        head of `width` features, whose per-row statistics are large-pool blocks: the mean (gone once + eps is
        made) and rsqrt (kept)."""
        n = T * (width or h)
        save(n * 4, n * e, transient=(n * 4,) * 3)
        sq = alloc(n * 4)
        if head:
            rows = n // d
            mean = alloc(rows * 4)
            prog.free(sq)
            eps = alloc(rows * 4)
            prog.free(mean)
            save(rows * 4)  # rsqrt
            prog.free(eps)
        else:
            prog.free(sq)
        xr = 0
        if full:
            save(n * 4)
        else:
            xr = alloc(n * 4)
        scaled = alloc(n * 4)
        if xr:
            prog.free(xr)
        out = 0
        if full and feeds_linears:
            save(n * e)
        else:
            out = alloc(n * e)
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

    def base_output(name: str, out: int) -> int:
        """The frozen or trained linear's own output (QLoRA: with its weight dequantized around it, nf4.py)."""
        if quantized:
            lin = all_lins[name]
            return nf4.forward_output(prog, lin.in_features * lin.out_features, e, T * out * e)
        return alloc(T * out * e)

    def project(name: str, width: int, out: int, stop: bool = False) -> int:
        """The linear's output handle (T x out in the activation dtype); with `stop`, 0 once lora_A has run (the
        recompute's early stop)."""
        weight_grad(name)
        if name not in ctx.lora:
            return base_output(name, out)
        base = base_output(name, out)
        if lora16:
            return project_16(name, out, base, stop)
        if dt.autocast16:
            return project_autocast(name, width, out, base, stop)
        save(T * width * 4, 0, transient=(T * out * 4, T * width * 4))  # x in fp32, kept by lora_A
        names[name + ".x32"] = last_kept()
        save(T * rank * 4)  # lora_A's output, kept by lora_B
        names[name + ".a"] = last_kept()
        if stop:
            prog.free(base)
            return 0
        b = alloc(T * out * 4)
        scaled = alloc(T * out * 4)
        prog.free(b)
        total = alloc(T * out * 4)
        prog.free(scaled)
        prog.free(base)
        res = alloc(T * out * e)
        prog.free(total)
        return res

    def project_16(name: str, out: int, base: int, stop: bool) -> int:
        """peft's lora.Linear.forward with 16-bit adapters (--lora-dtype bf16, as TRL casts them for QLoRA; the
        recorded history trl_qlora_llama8b_b1): no cast, lora_A keeps its input as it is (the caller keeps that
        tensor: keep_input), lora_A's output (kept by lora_B), then lora_B's output, times the scaling and plus
        the base output, each freeing the one before; the sum is the output."""
        save(T * rank * e)  # lora_A's output, kept by lora_B
        names[name + ".a"] = last_kept()
        if stop:
            prog.free(base)
            return 0
        return lora_update(prog, 0, T * out * e, T * out * e, base)

    def keep_input(handle: int, name: str) -> None:
        """A 16-bit adapter's input, kept by its lora_A until backward (LoraBackward frees it at the last reader)."""
        save_handle(handle)
        names[name] = last_kept()

    def done_with(handle: int, name: str) -> None:
        """A projection's input the layer has used: kept as a 16-bit adapter's input, else freed."""
        if lora16:
            keep_input(handle, name)
        else:
            prog.free(handle)

    def project_autocast(name: str, width: int, out: int, base: int, stop: bool) -> int:
        """peft's lora.Linear.forward under autocast over 16-bit weights, as the recorded history
        ac_llama1b_lora_b4 shows it: x cast to the adapter's fp32 (peft), then back to 16 bits by autocast for
        lora_A (kept by lora_A, with autocast's 16-bit copy of A's weight); lora_A's output in 16 bits (kept by
        lora_B, with B's weight copy); lora_B's output, times the scaling and plus the base output, in 16 bits (the
        sum is the linear's output: no cast back); the fp32 x goes last."""
        x32 = alloc(T * width * 4)
        save(rank * width * e)  # autocast's copy of lora_A's weight
        names[name + ".wa"] = last_kept()
        save(T * width * e, 0, transient=(T * out * e, T * width * 4))  # x in 16 bits, kept by lora_A
        names[name + ".x32"] = last_kept()
        save(T * rank * e)  # lora_A's output, kept by lora_B
        names[name + ".a"] = last_kept()
        save(out * rank * e)  # lora_B's weight copy, kept by lora_B
        names[name + ".wb"] = last_kept()
        if stop:  # the recompute has made what lora_B keeps
            prog.free(base)
            prog.free(x32)
            return 0
        total = lora_update(prog, 0, T * out * e, T * out * e, base)
        prog.free(x32)
        return total

    def head_norm(width: int, src: int) -> int:
        """Qwen3's q_norm / k_norm (RMSNorm over each head) on a projection's output, which it frees: x.to(fp32)
        kept, pow, x * rsqrt, .to(dtype) (kept when the weight trains), weight * y (RoPE's input)."""
        stats: list[int] = []
        y32 = rms_norm_start(layer_, T, width, e, rows=T * width // d, stats=stats)
        which = "q_norm" if "q_norm.x32" not in names else "k_norm"
        names[which + ".x32"], names[which + ".rs"] = stats[0], stats[1]
        if full:
            save(T * width * e)
            out = alloc(T * width * e)
            prog.free(y32)
        else:
            # (frees x * rsqrt before the cast, not after: two frees in a row leave the same cache either way)
            out = rms_norm_frozen(layer_, y32, T, width, e)
        prog.free(src)
        prog.free(stats[2])  # the mean
        return out

    q_w, kv_w = a * d, kv * d
    gemma = spec.model_type in GEMMA_NORMS
    normed = gemma_norm(0, True) if gemma else norm()
    fused_qkv = "qkv_proj" in lins
    if fused_qkv:
        q_out = k_out = 0  # q, k and v are views of the fused output
        v_out = project("qkv_proj", h, q_w + 2 * kv_w)
    elif spec.model_type == "gemma3_text":
        # Gemma 3 projects q, k and v first, then runs q_norm and k_norm (h50_ft_gemma3_1b_b4)
        q_out, k_out, v_out = project("q_proj", h, q_w), project("k_proj", h, kv_w), project("v_proj", h, kv_w)
        q_out, k_out = gemma_norm(q_out, width=q_w, head=True), gemma_norm(k_out, width=kv_w, head=True)
    else:
        q_out = project("q_proj", h, q_w)
        if spec.qk_norm:
            q_out = head_norm(q_w, q_out)
        k_out = project("k_proj", h, kv_w)
        if spec.qk_norm:
            k_out = head_norm(kv_w, k_out)
        v_out = project("v_proj", h, kv_w)
    # the rotated q and k, kept by attention; apply_rotary_pos_emb returns both before the attention module rebinds
    # its locals, so the projections' q and k go after both (qwen3_8b_lora_ckpt_s2048_b5_cap40)
    q_new = rope(prog, T, q_w, e)
    k_new = rope(prog, T, kv_w, e)
    prog.free(q_out)
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
    elif ctx.backend == "eager":
        o_keeps = full or (lora16 and "o_proj" in ctx.lora)
        o_out = eager_attention_train(layer_, ctx, q_new, k_new, v_out, lambda: project("o_proj", q_w, h), o_keeps)
    else:
        # past the sliding window (a mask: the 'efficient' backend here; in bf16 the H200 runs cuDNN's kernel for it,
        # docs/calibration/sdpa_layout.txt, with the same tensors) transformers repeats K and V to every head
        # (sdpa_attention.repeat_kv: copies kept by the kernel, the rotated k and the projected v then go with the
        # attention module's locals after o_proj; one K/V head repeats as a stride-0 view, no copy) and SDPA converts
        # the boolean mask to the query's dtype, [B, 1, S, S], kept for the kernel's backward (the recorded histories
        # h51_lora_mistral7b_b1_s4096, h50_lora_phi3mini_b2_s4096: 64 MiB a layer at 2 x 4096, allocated -3.4%
        # without it; h50_ft_gemma3_1b_b4, whose global layers take no mask)
        masked = masked_attention(ctx.backend, ctx.mask, spec, layer)
        repeated = masked and 1 < kv < a
        save_handle(q_new, T * q_w * e)
        if repeated:
            save(T * q_w * e, T * q_w * e)  # k repeated
            save(T * q_w * e, T * q_w * e)  # v repeated
        else:
            save_handle(k_new, T * kv_w * e)
            save_handle(v_out, T * kv_w * e)  # v, or the fused qkv output it is a view of
        if masked:
            save(T * ctx.w.seq * e)
        save(T * q_w * e)  # attention output, kept by the kernel's backward
        names["attn"] = last_kept()
        save(T * a * 4)  # log-sum-exp, fp32
        names.update(q_rot=q_new, k_rot=k_new, v=v_out, lse=last_kept())
        # cuDNN's kernel writes its output in q's layout; q rotated from a fused projection's view is [B, H, S, D], so
        # transpose(1, 2).contiguous() copies it for o_proj (h50_lora_phi3mini_b2_s4096, h24_phi3_mixed: 48 MiB at
        # 2 x 4096, gone when the attention module returns unless o_proj keeps it)
        copy = alloc(T * q_w * e) if fused_qkv else 0
        if copy and full:
            save_handle(copy)  # o_proj's input, kept for its weight's gradient (h53_ft_phi3mini_b1_s4096)
            copy = 0
        elif copy and lora16 and "o_proj" in ctx.lora:
            keep_input(copy, "o_proj.in")  # a 16-bit adapter keeps its input itself
            copy = 0
        o_out = project("o_proj", q_w, h)
        prog.free(copy)  # (0: kept above, or no copy)
        if repeated:
            prog.free(k_new)
            prog.free(v_out)
    if normed:
        done_with(normed, "in.out")
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
        names["act"] = last_kept()
        up = project("up_proj", h, width)
        save_handle(up, T * width * e, transient=(T * width * e,))  # kept by the product
        names.update(gate=gate, up=up)
    if full:
        prod = 0
        save(T * width * e)  # down_proj's input, kept for its weight gradient
    else:
        prod = alloc(T * width * e)  # down_proj's input
    if stop_early and "down_proj" not in ctx.lora:
        # full fine-tuning: down_proj's input is the last tensor the recompute saves, and autograd saves a node's
        # inputs before its kernel runs, so the recompute stops with no output made (h55_ft_mistral7b_ckpt_b1_s8192)
        weight_grad("down_proj")
        down_out = 0
    else:
        down_out = project("down_proj", width, h, stop=stop_early)
    if stop_early:
        # the frames unwind: the MLP product, the norm's output, the mid-layer residual
        done_with(prod, "prod")  # (with 16-bit adapters kept by down_proj's and gate/up's lora_A)
        done_with(normed, "post.out")
        if not fp32:  # (in fp32 the next norm keeps it: saved above)
            prog.free(resid)
        return layer_.finish()
    if prod:
        done_with(prod, "prod")
    if normed:
        done_with(normed, "post.out")
    if gemma:
        down_out = gemma_norm(down_out)  # post-feedforward norm
    out = alloc(T * h * r)  # the layer's output, residual + MLP output
    prog.free(down_out)
    if fp32:
        save_handle(out)  # kept by the next layer's norm (its pow), like resid above
    else:
        prog.free(resid)
        if residual_out is not None:
            residual_out.append(out)
        else:
            prog.free(out)  # the caller's residual stream is modelled outside the layer
    return layer_.finish()
