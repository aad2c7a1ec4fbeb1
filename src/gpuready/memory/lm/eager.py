"""transformers' eager attention under autograd in a recorded 16-bit layer (blocks_recorded.plain_block_forward)."""

from __future__ import annotations

from collections.abc import Callable

from gpuready.memory.lm.autograd import Layer
from gpuready.memory.lm.context import Ctx, softmax_upcast_copy
from gpuready.memory.program import Program


def eager_attention_train(
    layer_: Layer, ctx: Ctx, q_rot: int, k_rot: int, v: int, o_proj: Callable[[], int], o_keeps_input: bool
) -> int:
    """transformers' eager attention under autograd in a 16-bit layer, as the recorded histories
    h45_eager_ckpt_qwen15b_b2 and h47_lora_llama1b_eager_b1 run it: K and V repeated to every head (kept by the
    matmuls); past one sequence matmul's contiguous copies of the rotated q, and without grouped-query heads of k and
    later v (kept; strided_copies); q @ kᵀ, `* scaling`, Gemma 2's soft-capping (`/ cap`, tanh kept, `* cap`),
    `+ mask`, softmax's fp32 copy and fp32 output (kept), `.to(dtype)` (the probabilities, kept), their product with
    V and its transpose(1, 2).contiguous(), which o_proj keeps when its weight trains or a 16-bit adapter reads it
    (`o_keeps_input`; else it goes after o_proj); then the rotated q (when copied) and k and the projected v go.
    Backward, in the reverse of the nodes registered here: o_proj's input gradient, the transpose's, V's (held) and
    the probabilities', their cast to fp32, softmax's with its fp32 scratch, the casts back, the soft-capping's,
    `* scaling`'s, k's (held) and q's, then repeat_kv's sums of the held ones. Returns o_proj's output handle."""
    prog, spec, T, e = layer_.prog, ctx.spec, ctx.tokens, ctx.dt.act
    q_w, kv_w = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    scores = T * spec.heads * ctx.w.seq
    alloc, keep = layer_.alloc, layer_.keep_handle
    gqa = kv_w < q_w
    k_rep = alloc(T * q_w * e) if gqa else k_rot
    v_rep = alloc(T * q_w * e) if gqa else v
    copies = strided_copies(prog, ctx)
    q_copy = alloc(T * q_w * e) if copies else 0
    k_copy = alloc(T * q_w * e) if copies and not gqa else 0
    mm = alloc(scores * e)
    scaled = alloc(scores * e)
    prog.free(mm)
    tanh = 0
    if spec.attn_softcap:  # Gemma 2: / cap, tanh (its output kept for its backward), * cap, each rebinding the scores
        div = alloc(scores * e)
        prog.free(scaled)
        tanh = alloc(scores * e)
        prog.free(div)
        scaled = alloc(scores * e)
    masked = alloc(scores * e)
    prog.free(scaled)
    upcast = softmax_upcast_copy(ctx)  # (fp16 takes the fused half-to-float softmax: no copy)
    up = alloc(scores * 4) if upcast else 0
    sm = alloc(scores * 4)
    prog.free(up)
    probs = alloc(scores * e)
    prog.free(masked)
    v_copy = alloc(T * q_w * e) if copies and not gqa else 0
    av = alloc(T * q_w * e)
    out = alloc(T * q_w * e)
    prog.free(av)
    # matmul's backward makes both operands' gradients before it frees what it kept (h46_eager_full_qwen15b_b2): q @
    # kᵀ's dq and dk, dk held until repeat_kv's backward sums it, with dV, to the K/V heads, after K's copy goes
    keep(k_copy or k_rep, 0, release_side=(T * kv_w * e, T * kv_w * e))
    keep(q_copy or q_rot, T * q_w * e, side=(T * q_w * e,))
    layer_.grad_node(scores * e)  # `* scaling`
    if tanh:
        layer_.grad_node(scores * e)  # `/ cap`
        keep(tanh, scores * e)
        layer_.grad_node(scores * e)  # `* cap`
    if upcast:
        layer_.grad_node(scores * e)  # the fp32 copy's backward, cast back to 16 bits
        keep(sm, scores * 4, transient_after=(scores * 4,))
    else:  # the fused kernel's backward returns the 16-bit gradient (as blocks_train's generic layer)
        keep(sm, scores * e)
    layer_.grad_node(scores * 4)  # .to(dtype)'s backward: the probabilities' gradient cast to fp32
    keep(probs, 0)  # probs @ V's backward: dV (held) and dP, then V's copy, the incoming gradient and the probabilities
    keep(v_copy or v_rep, scores * e, side=(T * q_w * e,))
    layer_.grad_node(T * q_w * e)  # transpose(1, 2).contiguous()'s backward
    if o_keeps_input:  # o_proj's weight gradient (or a 16-bit adapter's lora_A) keeps its input
        keep(out, T * q_w * e)
    o_out = o_proj()
    if not o_keeps_input:  # an fp32 adapter keeps its own fp32 copy, a frozen linear nothing
        prog.free(out)
    if q_copy:
        prog.free(q_rot)
    if gqa or copies:
        prog.free(k_rot)
        prog.free(v)
    return o_out


def strided_copies(prog: Program, ctx: Ctx) -> bool:
    """Whether eager attention's matmuls copy their operands: the projections' outputs keep their token-major strides
    through view/transpose (and RoPE, whose elementwise ops keep an input's layout), so [B, H, S, D] cannot be viewed
    as [B * H, S, D] for bmm when B > 1 and matmul's reshape copies it (ATen's _matmul_impl); with one sequence it is
    a view (the recorded history h47_lora_llama1b_eager_b1 has no copy; h45_eager_ckpt_qwen15b_b2, at batch 2, copies
    q). K and V repeated to grouped-query heads (repeat_kv) are contiguous already."""
    return bool(ctx.tokens > ctx.w.batch) and prog.from_batch(ctx.w.batch, 2)
