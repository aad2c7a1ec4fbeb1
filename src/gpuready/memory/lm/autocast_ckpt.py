"""Full fine-tuning under autocast (fp32 weights and residual stream, bf16 matmuls: the HF Trainer's `bf16=True`
over an fp32 model): one layer's forward and backward in the order the recorded H200 histories show them.

With activation checkpointing, the recompute and backward (docs/calibration/histories/ft_llama1b_mixed_ckpt_s4096;
with the generic backward the second step's logits needed one 15.66 GiB segment more than the GPU took, +21.2%).
Without it, the same layer whole in the forward and the same backward (h45_mixed_smollm2_360m_b16,
h42_mixed_qwen15b_b4, h43_mixed_*): the generic layer (blocks_train) made an fp32 copy of the residual for each
norm's pow and another for `.to(input_dtype)`, neither of which exists when the input is already fp32, and walked
the generic backward; with peak allocated exact, smollm2-360m at 16 x 2048 reserved -7.7% and qwen2.5-1.5b at
4 x 1024 +10.5% (both now exact).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuready.memory.lm.context import Ctx
from gpuready.memory.lm.ops import flash_backward_workspace_bytes, reduce_buffer_bytes, rope_backward
from gpuready.memory.program import Program


def _plain_mixed_layer(ctx: Ctx) -> bool:
    """Full fine-tuning under autocast (fp32 weights and residual stream) of a plain Llama-style layer (RMSNorm,
    separate q/k/v/o, gated MLP, flash attention) on one GPU: the layer the recorded histories show."""
    spec, lins = ctx.spec, {lin.name: lin for lin in ctx.spec.block_linears}
    names = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    return (
        ctx.dt.autocast
        and ctx.full
        and ctx.shards == 1
        and ctx.backend == "flash"  # (with a mask SDPA takes the memory-efficient kernel on repeated K/V: not recorded)
        and spec.norm == "rms"
        and spec.norms_per_layer == 2
        and spec.gated_mlp
        and not (spec.mla or spec.experts or spec.shared_intermediate or spec.learned_positions)
        and (not spec.qk_norm or spec.model_type == "qwen3")  # Qwen3's head norms: h52_ft_qwen3_4b_mixed_b1
        and set(lins) == names
        and not any(lin.count != 1 for lin in lins.values())
        and spec.model_type in ("llama", "mistral", "qwen2", "qwen3")
    )


def mixed_ckpt_recorded(ctx: Ctx) -> bool:
    """Whether full fine-tuning under autocast with checkpointing follows the recorded per-layer recompute and
    backward (mixed_ckpt_layer_backward): the plain layer, its linears without biases."""
    # (not Qwen3's head norms: their recompute is unrecorded, and on this path held-out set 48's qwen3-4b at 2 x 4096
    # came out -5.2% on the reserve, allocated exact; the generic checkpointed layer gives -0.2%)
    return (
        ctx.w.grad_ckpt
        and _plain_mixed_layer(ctx)
        and not ctx.spec.qk_norm
        and not any(lin.bias for lin in ctx.spec.block_linears)
    )


def autocast_full_recorded(ctx: Ctx) -> bool:
    """Whether full fine-tuning under autocast without checkpointing follows mixed_layer_forward (whole) and
    mixed_layer_backward: the plain layer. (Qwen2's q/k/v biases are taken as their weights' neighbours: their casts
    and gradients are small-pool blocks; qwen2.5-0.5b/1.5b/3b mixed rows within 0.1%.)"""
    return not ctx.w.grad_ckpt and _plain_mixed_layer(ctx)


@dataclass(frozen=True)
class MixedLayer:
    """The handles one layer's forward under autocast keeps for its backward (mixed_layer_forward)."""

    n1_y: int
    wq: int
    q_in: int
    wk: int
    k_in: int
    wv: int
    v_in: int
    v: int
    k16: int
    q16: int
    attn: int
    lse: int
    wo: int
    resid: int
    n2_y: int
    wg: int
    g_in: int
    gate: int
    silu: int
    wu: int
    u_in: int
    up: int
    prod: int
    wd: int
    # Qwen3's q_norm and k_norm: x.to(fp32), rsqrt and the 16-bit y each kept (0 without head norms)
    heads: tuple[int, ...] = ()


def _helpers(
    prog: Program, grads: list[int], accumulate: bool
) -> tuple[Callable[[int], int], Callable[[int, int], int], Callable[[int, int], None]]:
    alloc, free = prog.alloc, prog.free

    def act(nbytes: int) -> int:
        return alloc("activations", nbytes)

    def wcast(n_in: int, n_out: int) -> int:
        return alloc("autocast_weight_copies", n_in * n_out * 2)

    def weight_grad(n_in: int, n_out: int) -> None:
        g = alloc("gradients", n_in * n_out * 4)
        if accumulate:
            free(g)
        else:
            grads.append(g)

    return act, wcast, weight_grad


def mixed_layer_forward(prog: Program, ctx: Ctx, whole: bool) -> tuple[MixedLayer, int]:
    """One layer's forward under autocast in the recorded order (below): the norms on the fp32 residual (pow keeps
    it: no copy), each linear's bf16 weight copy and its own bf16 cast of its input, RoPE's products in fp32, SDPA's
    casts of k then q. `whole` False: a checkpointed layer's recompute, which stops once down_proj's input is made
    (non-reentrant checkpointing's early stop: the post-attention norm's output goes, no output is made); True: the
    whole layer (h45_mixed_smollm2_360m_b16): down_proj's output, the norm's output going, the layer's output (fp32,
    returned: kept by the next norm) and down_proj's output going."""
    spec, T = ctx.spec, ctx.tokens
    h, a, d = spec.hidden, spec.heads, spec.head_dim
    q_w, kv_w, inter = a * d, spec.kv_heads * d, spec.intermediate
    free = prog.free
    act, wcast, _ = _helpers(prog, [], True)
    h32, h16 = T * h * 4, T * h * 2
    # --- recompute: input norm, q/k/v, RoPE in fp32, attention, o_proj, residual, post-attention norm, MLP
    free(act(h32))  # pow
    n1_y = act(h32)  # x * rsqrt, kept for the weight's gradient
    n1_out = act(h32)
    heads: list[int] = []

    def head_norm(width: int, src: int) -> int:
        """Qwen3RMSNorm on q or k under autocast (h52_ft_qwen3_4b_mixed_b1): x.to(fp32) (kept), pow, the mean, + eps,
        rsqrt (kept), x * rsqrt in fp32, .to(bf16) (kept: the weight trains), the fp32 weight times it (fp32: RoPE's
        input, returned); the projection's output goes."""
        rows = T * width // d
        x32 = act(T * width * 4)
        sq = act(T * width * 4)
        mean = act(rows * 4)
        free(sq)
        eps = act(rows * 4)
        rs = act(rows * 4)
        free(eps)
        y32 = act(T * width * 4)
        y16 = act(T * width * 2)
        out = act(T * width * 4)
        free(y32)
        free(mean)
        free(src)
        heads.extend((x32, rs, y16))
        return out

    qk_norm = spec.qk_norm
    wq, q_in, q = wcast(h, q_w), act(h16), act(T * q_w * 2)
    if qk_norm:
        q = head_norm(q_w, q)
    wk, k_in, k = wcast(h, kv_w), act(h16), act(T * kv_w * 2)
    if qk_norm:
        k = head_norm(kv_w, k)
    wv, v_in, v = wcast(h, kv_w), act(h16), act(T * kv_w * 2)
    rope_in = 4 if qk_norm else 2  # bytes an element of RoPE's input (the head norms' output is fp32)

    def rope(width: int) -> int:
        a_ = act(T * width * 4)
        n_ = act(T * width * rope_in // 2)
        c_ = act(T * width * rope_in)
        free(n_)
        b_ = act(T * width * 4)
        free(c_)
        out = act(T * width * 4)
        free(a_)
        free(b_)
        return out

    q_rot = rope(q_w)
    k_rot = rope(kv_w)
    free(q)
    free(k)
    k16, q16 = act(T * kv_w * 2), act(T * q_w * 2)  # SDPA's casts of the fp32 rotated k and q
    attn, lse = act(T * q_w * 2), act(T * a * 4)
    wo, o = wcast(q_w, h), act(h16)
    free(q_rot)
    free(k_rot)
    free(n1_out)
    resid = act(h32)  # x + attention: the post-attention norm's input
    free(o)
    free(act(h32))  # pow
    n2_y = act(h32)
    n2_out = act(h32)
    wg, g_in, gate = wcast(h, inter), act(h16), act(T * inter * 2)
    silu = act(T * inter * 2)
    wu, u_in, up = wcast(h, inter), act(h16), act(T * inter * 2)
    prod = act(T * inter * 2)
    wd = wcast(inter, h)
    out = 0
    if whole:
        down = act(h16)
        free(n2_out)
        out = act(h32)
        free(down)
    else:
        free(n2_out)
    kept = MixedLayer(
        n1_y,
        wq,
        q_in,
        wk,
        k_in,
        wv,
        v_in,
        v,
        k16,
        q16,
        attn,
        lse,
        wo,
        resid,
        n2_y,
        wg,
        g_in,
        gate,
        silu,
        wu,
        u_in,
        up,
        prod,
        wd,
        tuple(heads),
    )
    return kept, out


def mixed_layer_backward(
    prog: Program, ctx: Ctx, m: MixedLayer, dy16: int, x_in: int, grads: list[int], accumulate: bool
) -> None:
    """One layer's backward under autocast in the recorded order (mixed_ckpt_layer_backward): `dy16`, the incoming
    gradient cast to bf16, goes after down_proj's backward; `x_in`, the layer's input (kept by its first norm's
    pow), goes in that norm's backward."""
    spec, T = ctx.spec, ctx.tokens
    h, a, d = spec.hidden, spec.heads, spec.head_dim
    q_w, kv_w, inter = a * d, spec.kv_heads * d, spec.intermediate
    alloc, free = prog.alloc, prog.free
    act, _, weight_grad = _helpers(prog, grads, accumulate)
    h32, h16 = T * h * 4, T * h * 2
    n1_y, wq, q_in, wk, k_in, wv, v_in, v = m.n1_y, m.wq, m.q_in, m.wk, m.k_in, m.wv, m.v_in, m.v
    k16, q16, attn, lse, wo, resid, n2_y = m.k16, m.q16, m.attn, m.lse, m.wo, m.resid, m.n2_y
    wg, g_in, gate, silu, wu, u_in, up, prod, wd = m.wg, m.g_in, m.gate, m.silu, m.wu, m.u_in, m.up, m.prod, m.wd
    # --- backward: down_proj, the product, up_proj, silu, gate_proj
    w16 = alloc("gradients", inter * h * 2)
    d_prod = act(T * inter * 2)
    free(prod)
    free(wd)
    free(dy16)
    weight_grad(inter, h)
    free(w16)
    d_a, d_b = act(T * inter * 2), act(T * inter * 2)
    free(silu)
    free(up)
    free(d_prod)
    w16, dx16 = alloc("gradients", h * inter * 2), act(h16)
    free(u_in)
    free(wu)
    free(d_a)
    d_n2 = act(h32)  # the norm output's gradient, in fp32 (accumulated in place below)
    free(dx16)
    weight_grad(h, inter)
    free(w16)
    d_gate = act(T * inter * 2)
    free(gate)
    free(d_b)
    w16, dx16 = alloc("gradients", h * inter * 2), act(h16)
    free(g_in)
    free(wg)
    free(d_gate)
    t = act(h32)  # cast to fp32, added into d_n2 in place
    free(dx16)
    free(t)
    weight_grad(h, inter)
    free(w16)

    def norm_backward(y: int, d_out: int, x: int) -> None:
        """RMSNorm's backward: the weight's gradient (a product and its reduction), then the input's, added into
        the residual gradient in place."""
        t1, t2 = act(h32), act(h32)
        free(y)
        prog.transient("activations", reduce_buffer_bytes(h, T))
        free(t2)
        free(d_out)
        t3, t4 = act(h32), act(h32)
        free(t3)
        free(t1)
        free(t4)
        t5, t6, t7, t8 = act(h32), act(h32), act(h32), act(h32)
        free(t7)
        free(t6)
        free(x)
        free(t5)
        free(t8)

    norm_backward(n2_y, d_n2, resid)
    # --- o_proj, attention, RoPE, v/k/q projections
    d_o16 = act(h16)  # the residual gradient cast to bf16
    w16, d_attn = alloc("gradients", q_w * h * 2), act(T * q_w * 2)
    free(wo)
    free(d_o16)
    weight_grad(q_w, h)
    free(w16)
    dq, dk, dv = act(T * q_w * 2), act(T * kv_w * 2), act(T * kv_w * 2)
    prog.transient("activations", flash_backward_workspace_bytes(spec, T))
    free(attn)
    free(lse)
    free(v)
    free(q16)
    free(k16)
    free(d_attn)
    dq32 = act(T * q_w * 4)
    free(dq)
    dk32 = act(T * kv_w * 4)
    free(dk)

    # RoPE's backward for k, then q: the products with cos and sin, rotate_half's gradient; k's and q's bf16
    # gradients are what remains
    def rope_backward16(width: int, grad32: int) -> int:
        """One of RoPE's backwards as recorded; frees the fp32 gradient and returns the bf16 one."""
        t1, t2 = act(T * width * 4), act(T * width * 2)
        free(t1)
        t3 = act(T * width)
        grad16 = act(T * width * 2)
        free(t3)
        t4 = act(T * width * 2)
        free(t2)
        free(t4)
        t5, t6 = act(T * width * 4), act(T * width * 2)
        free(t5)
        free(grad32)
        free(t6)
        return grad16

    def head_norm_backward(width: int, g32: int, kept: tuple[int, ...]) -> int:
        """Qwen3RMSNorm's backward under autocast as h52_ft_qwen3_4b_mixed_b1 records it: the weight's gradient (a
        product and its reduction over the tokens x heads rows), the 16-bit y's gradient and its fp32 cast, x *
        rsqrt's backward with its per-row temporaries, the input's gradient cast back to bf16, then made contiguous
        (returned)."""
        x32, rs, y16 = kept
        rows = T * width // d
        n4 = T * width * 4
        a_, b_ = act(n4), act(n4)
        prog.transient("activations", reduce_buffer_bytes(d, rows))
        free(b_)
        gy = act(T * width * 2)
        free(a_)
        free(g32)
        free(y16)
        gy32 = act(n4)
        free(gy)
        c_, dx = act(n4), act(n4)
        s1 = act(rows * 4)
        free(c_)
        free(gy32)
        s2, s3, s4 = act(rows * 4), act(rows * 4), act(rows * 4)
        prog.free_all([s3, s2, s1, rs])
        t1 = act(n4)
        free(s4)
        t2, t3, t4 = act(n4), act(n4), act(n4)
        prog.free_all([t3, t2, t1, x32, t4])
        dxb = act(T * width * 2)
        free(dx)
        out = act(T * width * 2)  # the transposed gradient made contiguous
        free(dxb)
        return out

    qk_norm = bool(m.heads)
    # (on Qwen3's head norms' fp32 output RoPE's backward casts nothing: ops.rope_backward)
    dk16 = rope_backward(prog, T * kv_w * 4, dk32) if qk_norm else rope_backward16(kv_w, dk32)
    dq16 = rope_backward(prog, T * q_w * 4, dq32) if qk_norm else rope_backward16(q_w, dq32)
    w16, dx16 = alloc("gradients", h * kv_w * 2), act(h16)
    free(v_in)
    free(wv)
    free(dv)
    d_n1 = act(h32)
    free(dx16)
    weight_grad(h, kv_w)
    free(w16)
    if qk_norm:
        dk_c = head_norm_backward(kv_w, dk16, m.heads[3:])
    else:
        dk_c = act(T * kv_w * 2)  # the transposed gradient made contiguous
        free(dk16)
    w16, dx16 = alloc("gradients", h * kv_w * 2), act(h16)
    free(k_in)
    free(wk)
    free(dk_c)
    t = act(h32)
    free(dx16)
    free(t)
    weight_grad(h, kv_w)
    free(w16)
    if qk_norm:
        dq_c = head_norm_backward(q_w, dq16, m.heads[:3])
    else:
        dq_c = act(T * q_w * 2)
        free(dq16)
    w16, dx16 = alloc("gradients", h * q_w * 2), act(h16)
    free(q_in)
    free(wq)
    free(dq_c)
    t = act(h32)
    free(dx16)
    free(t)
    weight_grad(h, q_w)
    free(w16)
    norm_backward(n1_y, d_n1, x_in)


def mixed_ckpt_layer_backward(prog: Program, ctx: Ctx, x_in: int, grads: list[int], accumulate: bool) -> None:
    """One checkpointed layer's recompute and backward under autocast (fp32 weights and residual stream, bf16
    matmuls), in the order the recorded history of llama-3.2-1b mixed + checkpointing at 8 x 4096
    (ft_llama1b_mixed_ckpt_s4096) shows: the bf16 cast of the incoming gradient (made before the recompute starts);
    the recompute up to down_proj's input (non-reentrant checkpointing stops once every saved tensor is back), each
    linear's bf16 weight copy cached until its backward; then per linear the bf16 weight gradient, the input's bf16
    gradient, the copies going, the input gradient cast to fp32 and the weight's fp32 gradient (.grad); the norms'
    backward with the reduction buffer of their weight's gradient; flash attention's backward workspace
    (batch x tokens x heads x (2 x head_dim + 1) fp32). The residual stream's gradient is one fp32 buffer that
    autograd accumulates in place (the caller's). `x_in`, the layer's checkpointed input, goes at the end."""
    dy16 = prog.alloc("activations", ctx.tokens * ctx.spec.hidden * 2)  # the incoming gradient cast to bf16
    kept, _ = mixed_layer_forward(prog, ctx, whole=False)
    mixed_layer_backward(prog, ctx, kept, dy16, x_in, grads, accumulate)


def mixed_final_norm_backward(prog: Program, ctx: Ctx, dx: int, y: int, x: int) -> int:
    """The final RMSNorm's backward on the fp32 residual (ft_llama1b_mixed_ckpt_s4096, h45_mixed_smollm2_360m_b16):
    its weight's gradient and reduction, then the input's: the residual stream's gradient buffer, which the layers'
    backward add into (returned). `dx` (lm_head's input gradient, fp32), `y` (x * rsqrt) and `x` (the last layer's
    output, kept by pow) go."""
    T, h = ctx.tokens, ctx.spec.hidden
    h32 = T * h * 4
    t1, t2 = prog.alloc("activations", h32), prog.alloc("activations", h32)
    prog.transient("activations", reduce_buffer_bytes(h, T))
    prog.free(t2)
    prog.free(dx)
    prog.free(y)
    t3 = prog.alloc("activations", h32)
    grad = prog.alloc("activations", h32)
    prog.free(t3)
    prog.free(t1)
    ts = [prog.alloc("activations", h32) for _ in range(4)]
    prog.free_all(ts[2::-1])
    prog.free(x)
    prog.free(ts[3])
    return grad
