"""Full fine-tuning under autocast without checkpointing (fp32 weights and residual stream, bf16 matmuls: the HF
Trainer's `bf16=True` over an fp32 model): one layer's forward in the order the recorded H200 histories show it
(h45_mixed_smollm2_360m_b16, h42_mixed_qwen15b_b4, h43_mixed_llama1b_b4_s1024, h43_mixed_qwen05b_b16_s512).

What the generic layer (blocks_train) got wrong here: the norms' input is already fp32, so `x.to(float32)` and
`.to(input_dtype)` are no copies; pow keeps the residual stream itself (the residual adds are kept until backward,
not an fp32 copy of them), x * rsqrt is kept for the weight's gradient and weight * y (fp32) lives until the
attention or MLP returns; every projection casts that fp32 output to bf16 for itself (kept by its matmul, after its
weight's bf16 copy); RoPE multiplies by fp32 cos and sin, so the rotated q and k are fp32 until SDPA casts them
back (k first, then q; kept). With the generic order smollm2-360m at 16 x 2048 reserved -7.7% and qwen2.5-1.5b at
4 x 1024 +10.5%, with peak allocated exact: the same bytes, other blocks. Backward keeps the generic walk's nodes
(autograd.block_backward), so the allocated peak stays where it was measured.
"""

from __future__ import annotations

from gpuready.memory.lm.autograd import Layer, Saved
from gpuready.memory.lm.context import Ctx
from gpuready.memory.lm.ops import rope
from gpuready.memory.program import Program


def autocast_full_recorded(ctx: Ctx) -> bool:
    """Whether a layer follows autocast_block_forward: full fine-tuning under autocast over fp32 weights, without
    checkpointing, on one GPU, of a plain Llama-style layer (RMSNorm, separate q/k/v, gated MLP, SDPA's fused
    kernels)."""
    spec = ctx.spec
    lins = {lin.name: lin for lin in spec.block_linears}
    names = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    return (
        ctx.dt.autocast
        and ctx.dt.resid == 4
        and ctx.full
        and not ctx.w.grad_ckpt
        and ctx.shards == 1
        and ctx.backend in ("flash", "efficient")
        and spec.norm == "rms"
        and spec.norms_per_layer == 2
        and spec.gated_mlp
        and not (spec.mla or spec.experts or spec.shared_intermediate or spec.qk_norm or spec.learned_positions)
        and set(lins) == names
        and not any(lin.count != 1 for lin in lins.values())
        and spec.model_type in ("llama", "mistral", "qwen2")
    )


def autocast_block_forward(prog: Program, ctx: Ctx, keep: bool) -> list[Saved]:
    """One layer (see the module's docstring). The layer's output (residual + MLP output, fp32) is kept by the next
    layer's norm: it is saved here (as in the fp32 recorded layer, blocks_recorded.plain_block_forward); the caller
    keeps the embedding output the first layer reads."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e = spec.hidden, dt.act
    q_w, kv_w, inter = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.intermediate
    lins = {lin.name: lin for lin in spec.block_linears}
    layer_ = Layer(prog, keep)
    alloc, save, save_handle = layer_.alloc, layer_.save, layer_.keep_handle

    def norm(x: int) -> int:
        """RMSNorm on the fp32 residual `x` (kept by pow: its node makes the input's gradient with three fp32
        temporaries, as the generic walk does); pow, x * rsqrt (kept by weight * y), weight * y (returned)."""
        save_handle(x, T * h * e, transient=(T * h * 4,) * 3)
        prog.free(alloc(T * h * 4))  # pow
        save(T * h * 4)  # x * rsqrt
        return alloc(T * h * 4)  # weight * y, fp32

    def project(name: str, src_cast: bool, out_bytes: int) -> int:
        """The linear's bf16 weight copy (kept until its backward), the input's bf16 cast (kept by the matmul, with
        the weight's fp32 gradient at its node) or, for a bf16 input, the weight gradient's node; its output."""
        lin = lins[name]
        numel = lin.in_features * lin.out_features
        layer_.keep_handle(prog.alloc("autocast_weight_copies", numel * 2))
        if src_cast:
            save(T * lin.in_features * e, 0, (numel * dt.param,))
        else:
            layer_.weight_grad(numel * dt.param)
        return alloc(out_bytes)

    # --- attention
    normed = norm(0)  # (its input, the previous layer's output or the embeddings, is kept already)
    q = project("q_proj", True, T * q_w * e)
    k = project("k_proj", True, T * kv_w * e)
    v = project("v_proj", True, T * kv_w * e)
    q_rot = rope(prog, T, q_w, e, product=4)
    k_rot = rope(prog, T, kv_w, e, product=4)
    prog.free(q)
    prog.free(k)
    save(T * kv_w * e, T * kv_w * e)  # SDPA's bf16 cast of k (kept)
    save(T * q_w * e, T * q_w * e)  # ... and of q
    save_handle(v, T * kv_w * e)  # v (bf16 already), kept by the kernel
    save(T * q_w * e)  # attention output, also o_proj's input
    save(T * spec.heads * 4)  # log-sum-exp
    o = project("o_proj", False, T * h * e)
    prog.free(q_rot)
    prog.free(k_rot)
    prog.free(normed)
    resid = alloc(T * h * 4)  # residual + attention output, fp32
    prog.free(o)
    # --- MLP
    normed = norm(resid)
    gate = project("gate_proj", True, T * inter * e)
    save_handle(gate, T * inter * e)  # kept by the activation
    save(T * inter * e, T * inter * e)  # silu(gate), kept by the product
    up = project("up_proj", True, T * inter * e)
    save_handle(up, T * inter * e, transient=(T * inter * e,))  # kept by the product
    save(T * inter * e, T * inter * e)  # the product, down_proj's input
    down = project("down_proj", False, T * h * e)
    prog.free(normed)
    out = alloc(T * h * 4)  # the layer's output, fp32: kept by the next layer's norm
    prog.free(down)
    save_handle(out)
    return layer_.finish()
