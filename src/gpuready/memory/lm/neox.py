"""GPT-NeoX (pythia) full fine-tuning, one layer under autograd and its backward, in the order the recorded H200
history of pythia-1b full fine-tuning at 8 x 1024 shows it (docs/calibration/histories/ft_pythia1b_b8.json.gz; the
generic layer had its temporaries in another order, the reserve -7.1%; pythia-410m's history, ft_pythia410m_b8,
follows the same order).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuready.memory.lm.context import Ctx
from gpuready.memory.lm.ops import flash_backward_workspace_bytes, reduce_buffer_bytes
from gpuready.memory.program import Program


def neox_recorded(ctx: Ctx) -> bool:
    """Whether a GPT-NeoX job can follow the recorded training layer (neox_train_forward/neox_train_backward):
    full fine-tuning in 16 bits with the parallel residual and flash attention, on one GPU, no checkpointing."""
    spec = ctx.spec
    return (
        spec.model_type == "gpt_neox"
        and spec.parallel_residual
        and ctx.full
        and ctx.dt.act == 2
        and not ctx.dt.autocast
        and not ctx.w.grad_ckpt
        and ctx.backend == "flash"
        and ctx.shards == 1
    )


@dataclass
class NeoxKept:
    """What one GPTNeoXLayer keeps for its backward (handles)."""

    x_in: int  # the layer's input, kept by both LayerNorms
    ln1: int
    qkv: int  # the fused projection's output (v is a view of it)
    q: int
    k: int
    attn: int
    lse: int
    attn_t: int  # the output made contiguous: dense's input
    ln2: int
    fc: int
    gelu: int
    # under --autocast: each LayerNorm's fp32 copy of the input, with its mean and rstd (ln1 and ln2 are then the
    # bf16 casts of their outputs, kept by the projections), first norm then second
    norms32: tuple[int, ...] = ()


def neox_train_forward(prog: Program, ctx: Ctx, x_in: int, free_input: bool = False) -> tuple[int, NeoxKept]:
    """GPTNeoXLayer's forward under autograd, in the order the recorded history of pythia-1b full fine-tuning at
    8 x 1024 (ft_pythia1b_b8) shows: LayerNorm, query_key_value (kept whole), RoPE on the first rotary_dims of q
    and k with torch.cat back to full width (kept by attention), the kernel's output and log-sum-exp, its
    contiguous copy (dense's input), dense; the second LayerNorm of the same input, dense_h_to_4h, GELU (both kept),
    dense_4h_to_h; mlp + attention, + input: the layer's output (kept by the next layer's norms). Returns it.

    Under --autocast (history ac_pythia1b_b8) each LayerNorm runs in fp32 on an fp32 copy of its input (kept, with
    its mean and rstd), its fp32 output cast to bf16 for the projection (the cast kept, the fp32 output gone after
    the attention's dense or the MLP's last linear); the input is then kept by nothing, and goes once the layer
    has returned (`free_input`: not the embedding output, which the model holds)."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r = spec.hidden, dt.act, dt.resid
    w = spec.heads * spec.head_dim
    rot = spec.heads * (spec.rotary_dims or spec.head_dim)
    alloc, free = prog.alloc, prog.free

    def act(nbytes: int) -> int:
        return alloc("activations", nbytes)

    def rope_part() -> int:
        a = act(T * rot * e)
        neg = act(T * rot * e // 2)
        cat = act(T * rot * e)
        free(neg)
        b = act(T * rot * e)
        free(cat)
        out = act(T * rot * e)
        free(a)
        free(b)
        return out

    norms32: list[int] = []

    def norm() -> tuple[int, int]:
        """The LayerNorm's kept output (or its bf16 cast under autocast) and its fp32 output (0 without)."""
        if not dt.autocast16:
            return act(T * h * r), 0
        x32, out32 = act(T * h * 4), act(T * h * 4)
        norms32.extend([x32, act(T * 4), act(T * 4)])
        return act(T * h * e), out32

    ln1, out1 = norm()
    qkv = act(T * 3 * w * e)
    q_rot, k_rot = rope_part(), rope_part()
    q = act(T * w * e)
    free(q_rot)
    k = act(T * w * e)
    free(k_rot)
    attn, lse = act(T * w * e), act(T * spec.heads * 4)
    attn_t = act(T * w * e)
    dense = act(T * h * e)
    free(out1)
    ln2, out2 = norm()
    fc = act(T * spec.intermediate * e)
    gelu = act(T * spec.intermediate * e)
    mlp = act(T * h * e)
    free(out2)
    s1 = act(T * h * r)
    out = act(T * h * r)
    free(s1)
    free(dense)
    free(mlp)
    kept_input = x_in
    if dt.autocast16:
        kept_input = 0
        if free_input:
            free(x_in)
    return out, NeoxKept(kept_input, ln1, qkv, q, k, attn, lse, attn_t, ln2, fc, gelu, tuple(norms32))


def neox_train_backward(prog: Program, ctx: Ctx, kept: NeoxKept, g: int, grads: list[int], accumulate: bool) -> int:
    """GPTNeoXLayer's backward in the recorded order (ft_pythia1b_b8): dense_4h_to_h, GELU, dense_h_to_4h, the
    second LayerNorm, the input's gradient (the incoming one plus the norm's), dense, flash attention with its
    workspace, RoPE, query_key_value, the first LayerNorm (added into the input's gradient in place). Each linear
    makes its input's gradient, its weight's gradient (kept as .grad) and its bias's gradient, whose sum over the
    tokens takes the reduction's global buffer for a moment (reduce_buffer_bytes). `g` (the output's gradient)
    goes after dense's backward. Returns the input's gradient."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, inter = spec.hidden, dt.act, spec.intermediate
    w = spec.heads * spec.head_dim
    rot = spec.heads * (spec.rotary_dims or spec.head_dim)
    alloc, free = prog.alloc, prog.free

    def act(nbytes: int) -> int:
        return alloc("activations", nbytes)

    def linear_grads(n_in: int, n_out: int) -> None:
        wg = alloc("gradients", n_in * n_out * dt.param)
        if accumulate:
            free(wg)
        else:
            grads.append(wg)
        prog.transient("activations", reduce_buffer_bytes(n_out, T))

    def norm_backward(g: int, norms32: tuple[int, ...]) -> int:
        """A LayerNorm's input gradient from its output's (freed); under autocast through fp32 (the cast's
        backward, the norm's in fp32 freeing its fp32 input copy, mean and rstd, the cast back)."""
        if not norms32:
            out = act(T * h * e)
            free(g)
            return out
        g32 = act(T * h * 4)
        free(g)
        t32 = act(T * h * 4)
        free(g32)
        prog.free_all(list(norms32))
        out = act(T * h * e)
        free(t32)
        return out

    d_gelu = act(T * inter * e)  # dense_4h_to_h
    linear_grads(inter, h)
    free(kept.gelu)
    d_fc = act(T * inter * e)  # GELU
    free(d_gelu)
    free(kept.fc)
    d_ln2 = act(T * h * e)  # dense_h_to_4h
    linear_grads(h, inter)
    free(d_fc)
    free(kept.ln2)
    dx2 = norm_backward(d_ln2, kept.norms32[3:])  # the second LayerNorm
    dx = act(T * h * e)  # the incoming gradient plus the norm's: the input's gradient
    free(dx2)
    d_attn = act(T * w * e)  # dense
    linear_grads(w, h)
    free(g)
    free(kept.attn_t)
    dq, dk, dv = act(T * w * e), act(T * w * e), act(T * w * e)
    prog.transient("activations", flash_backward_workspace_bytes(spec, T))
    free(d_attn)
    free(kept.k)
    free(kept.q)
    free(kept.qkv)
    free(kept.attn)
    free(kept.lse)
    rots = []
    for _ in ("k", "q"):  # RoPE's backward on the rotary part, k first
        t1, t2 = act(T * rot * e), act(T * rot * e // 2)
        d_rot = act(T * rot * e)
        free(t2)
        t3 = act(T * rot * e)
        free(t1)
        free(t3)
        free(act(T * rot * e))
        rots.append(d_rot)
    full = []
    for d_part, d_rot in ((dk, rots[0]), (dq, rots[1])):  # back to full width
        t = act(T * w * e)
        free(d_part)
        t2 = act(T * w * e)
        free(d_rot)
        free(t2)
        full.append(t)
    d_qkv = act(T * 3 * w * e)
    free(full[1])
    free(full[0])
    free(dv)
    d_qkv2 = act(T * 3 * w * e)
    free(d_qkv)
    d_ln1 = act(T * h * e)  # query_key_value
    linear_grads(h, 3 * w)
    free(d_qkv2)
    free(kept.ln1)
    dx1 = norm_backward(d_ln1, kept.norms32[:3])  # the first LayerNorm, added into dx in place
    free(kept.x_in)
    free(dx1)
    return dx
