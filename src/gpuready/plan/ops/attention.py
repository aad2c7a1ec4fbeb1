"""Scaled dot-product attention as the kernel SDPA picks runs it: the fused flash and memory-efficient kernels,
or the math path's and eager attention's batched GEMMs and element-wise passes over the scores.
"""

from __future__ import annotations

from gpuready.plan.ops.base import Math, Op, _gemm, _mem, _Steps


def _attention(
    s: _Steps,
    backend: str,
    batch: int,
    heads: int,
    q_len: int,
    kv_len: int,
    head_dim: int,
    e: int,
    math: Math,
    *,
    causal: bool,
    window: int | None,
    fwd: float,
    backward: bool,
    layers: int,
    masked: bool = False,
) -> None:
    """Scaled dot-product attention over `layers` layers. `masked`: the fused kernel is given a mask tensor (a
    sliding window once the sequence reaches it, memory/lm/context.attention_backend; in bf16 on the H200 the
    dispatcher runs it on cuDNN's attention, in fp32 on the memory-efficient kernel: docs/calibration/
    sdpa_layout.txt). A kernel given a mask adds it to every score it computes: it computes the whole S x S square
    (the causal half and the window's band are skipped only with no mask tensor) and reads the [B, 1, S, S] mask in
    the activations' dtype for each head. Held-out set 55: Mistral-7B LoRA + checkpointing at 32,768 tokens measured
    12.95 s a step where the window's band gave 5.84 s; set 56, predicted with this: 0.84-0.93 of the measured step
    where the band gave 0.66-0.84 (docs/steptime.md)."""
    # with no mask tensor, a window narrower than the keys leaves a band of it; a wider one, plain causal attention
    banded = window is not None and kv_len > window and not masked
    span = min(kv_len, window) if banded and window is not None else kv_len
    bh = batch * heads * layers
    if backend in ("flash", "efficient"):
        # fused kernels with no mask tensor skip the masked half of a causal S x S square
        half = causal and q_len == kv_len and not masked and not banded
        pairs = q_len * span * (0.5 if half else 1.0)
        f = 4.0 * bh * pairs * head_dim
        io = 4.0 * bh * q_len * head_dim * e  # q, k, v in, out
        if masked:
            io += float(bh) * q_len * kv_len * e  # the mask, read for each head
        s.add(Op("attention", "attention", f, io, layers, q_len, span, head_dim, math=math, masked=masked), fwd)
        if backward:
            s.add(
                Op("attention", "attention", 2.5 * f, 2.5 * io, layers, q_len, span, head_dim, math=math, masked=masked)
            )
        return
    # math / eager: two batched GEMMs over the whole square, then element-wise passes over the scores
    scores = float(bh) * q_len * kv_len
    sc = 4 if backend == "math" else e  # sdpa's math path runs in the query dtype; eager's softmax upcasts
    # scale (eager folds it into the first matmul), mask add (read scores + mask, write), softmax to fp32
    # (read, write 4 B), cast back (read 4, write e), PV reads the probabilities
    fwd_bytes = scores * (2 * sc + 2 * sc + (sc + 4) + (4 + e))
    s.add(_gemm("attention", q_len, kv_len, head_dim, e, math, bh, layers), fwd)
    s.add(_gemm("attention", q_len, head_dim, kv_len, e, math, bh, layers), fwd)
    s.add(_mem("attention", fwd_bytes, 4 * layers), fwd)
    if backward:
        s.add(_gemm("attention", q_len, kv_len, head_dim, e, math, 2 * bh, 2 * layers))  # dP and dV
        s.add(_gemm("attention", q_len, head_dim, kv_len, e, math, 2 * bh, 2 * layers))  # dQ and dK
        # softmax backward, the casts' and scale's backward: about 1.5x the forward passes
        s.add(_mem("attention", 1.5 * fwd_bytes, 6 * layers))
