"""One decoder layer's forward without autograd (inference, and the first pass of a checkpointed layer)."""

from __future__ import annotations

from gpuready.memory.lm.context import Ctx, mlp_width
from gpuready.memory.lm.ops import eager_nograd, rms_norm_nograd, rope
from gpuready.memory.program import Program


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
    width, fan = mlp_width(spec, layer)

    def norm() -> int:
        return rms_norm_nograd(prog, T, h, r, gemma=spec.model_type == "gemma3_text")

    def rotated(width: int) -> int:
        out = rope(prog, T, width, e)
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
    q2 = rotated(q_w)
    k2 = rotated(k_w)
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
        attn, probs = eager_nograd(prog, ctx, q_w, k_w, v_w, out_w)
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

    q_rot, k_rot = rope(prog, T, rot, e), rope(prog, T, rot, e)
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
