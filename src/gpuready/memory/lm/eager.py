"""transformers' eager attention under autograd in a recorded 16-bit layer (blocks_recorded.plain_block_forward)."""

from __future__ import annotations

from collections.abc import Callable

from gpuready.memory.lm.autograd import Layer
from gpuready.memory.lm.context import Ctx, softmax_upcast_copy


def eager_attention_train(layer_: Layer, ctx: Ctx, q_rot: int, k_rot: int, v: int, o_proj: Callable[[], int]) -> int:
    """transformers' eager attention under autograd in a 16-bit layer, as the recorded history
    h45_eager_ckpt_qwen15b_b2 runs it: K and V repeated to every head (kept by the matmuls), matmul's contiguous copy
    of the rotated q (kept), q @ kᵀ, `* scaling`, `+ mask`, softmax's fp32 copy and fp32 output (kept), `.to(dtype)`
    (the probabilities, kept), their product with V and its transpose(1, 2).contiguous() (kept: o_proj's input);
    o_proj; then the rotated q and k and the projected v go (without grouped-query heads the matmuls keep k and v
    themselves). Backward, in the reverse of the nodes registered here: o_proj's input gradient, the transpose's, V's
    and the probabilities', their cast to fp32, softmax's with its fp32 scratch, the casts back, `* scaling`'s, q's
    and k's. Returns o_proj's output handle."""
    prog, spec, T, e = layer_.prog, ctx.spec, ctx.tokens, ctx.dt.act
    q_w, kv_w = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    scores = T * spec.heads * ctx.w.seq
    alloc, keep = layer_.alloc, layer_.keep_handle
    gqa = kv_w < q_w
    k_rep = alloc(T * q_w * e) if gqa else k_rot
    v_rep = alloc(T * q_w * e) if gqa else v
    q_copy = alloc(T * q_w * e)
    mm = alloc(scores * e)
    scaled = alloc(scores * e)
    prog.free(mm)
    masked = alloc(scores * e)
    prog.free(scaled)
    upcast = softmax_upcast_copy(ctx)  # (fp16 takes the fused half-to-float softmax: no copy)
    up = alloc(scores * 4) if upcast else 0
    sm = alloc(scores * 4)
    prog.free(up)
    probs = alloc(scores * e)
    prog.free(masked)
    av = alloc(T * q_w * e)
    out = alloc(T * q_w * e)
    prog.free(av)
    keep(k_rep, T * q_w * e)
    keep(q_copy, T * q_w * e)
    layer_.grad_node(scores * e)  # `* scaling`
    if upcast:
        layer_.grad_node(scores * e)  # the fp32 copy's backward, cast back to 16 bits
        keep(sm, scores * 4, transient_after=(scores * 4,))
    else:  # the fused kernel's backward returns the 16-bit gradient (as blocks_train's generic layer)
        keep(sm, scores * e)
    layer_.grad_node(scores * 4)  # .to(dtype)'s backward: the probabilities' gradient cast to fp32
    keep(probs, scores * e)
    keep(v_rep, T * q_w * e)
    layer_.grad_node(T * q_w * e)  # transpose(1, 2).contiguous()'s backward
    keep(out, T * q_w * e)  # o_proj's input
    o_out = o_proj()
    prog.free(q_rot)
    if gqa:
        prog.free(k_rot)
        prog.free(v)
    return o_out
