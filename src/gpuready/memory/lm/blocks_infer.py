"""One decoder layer's forward without autograd (inference, and the first pass of a checkpointed layer)."""

from __future__ import annotations

from gpuready.memory.lm import nf4
from gpuready.memory.lm.blocks_gpt import gpt2_block_nograd, neox_block_nograd
from gpuready.memory.lm.context import GEMMA_FAMILY, Ctx, layer_lora, masked_attention, mlp_width
from gpuready.memory.lm.moe import (
    EXPERTS_INTERFACE_TYPES,
    batched_experts_decode,
    grouped_experts_nograd,
    llama4_experts_nograd,
)
from gpuready.memory.lm.ops import eager_nograd, lora_update, rms_norm_nograd, rope
from gpuready.memory.program import Program


def block_nograd(
    prog: Program,
    ctx: Ctx,
    x: int,
    layer: int,
    cache_kv: bool,
    keep_input: bool = False,
    casts: list[int] | None = None,
    cache_casts: bool = True,
    decode: bool = False,
    context: int = 0,
    adapter_casts: list[int] | None = None,
) -> tuple[int, list[int]]:
    """One decoder layer's forward without autograd (inference, or the first pass of a checkpointed layer):
    tensors are freed as soon as Python drops them. Returns the new residual handle and, with cache_kv,
    the layer's K and V (kept as the KV cache; otherwise they are freed). `decode`: one of generate()'s decode
    steps (MoE experts run batched_mm there); `context`: the tokens attention reads (the cache's length while
    decoding; MLA expands all of them again).

    `casts` (a list): the layer runs under torch.autocast(bfloat16) with fp32 weights and an fp32 residual stream,
    as the recorded history of llama-3.2-1b mixed + checkpointing (ft_llama1b_mixed_ckpt_s4096) shows its
    checkpointed forward: each linear's bf16 weight copy is made at its first use and cached (its handle is
    appended to `casts`, kept until the autocast region ends); a linear that reads the fp32 norm output casts it
    to bf16 first (a temporary per projection); RoPE multiplies the bf16 q and k by fp32 cos and sin, so the
    rotated q and k are fp32; SDPA casts them back to bf16 for the kernel. Autocast caches only the casts of leaf
    weights that require grad (aten/src/ATen/autocast_mode.cpp, cached_cast's can_try_cache): with frozen weights
    (`cache_casts` False: LoRA) each copy goes once its matmul has run.

    `adapter_casts` (a list): a checkpointed LoRA layer's first pass under autocast over 16-bit weights
    (--autocast): the adapters' 16-bit weight copies are cached the same way (appended to it)."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r = spec.hidden, dt.act, dt.resid
    autocast = casts is not None
    # QLoRA's checkpointed first pass (training): each 4-bit linear dequantized as under autograd
    quantized = ctx.w.method == "qlora" and ctx.w.task == "train"
    weights = {
        lin.name.split(".")[-1]: lin.in_features * lin.out_features * lin.count * 2 for lin in spec.block_linears
    }

    # peft's adapters in a checkpointed layer's first pass (16-bit, no autocast): the recompute in backward models
    # them under autograd (blocks_recorded.plain_block_forward's project)
    adapted = layer_lora(ctx, layer) if ctx.w.task == "train" and casts is None else frozenset()
    in_features = {lin.name.split(".")[-1]: lin.in_features for lin in spec.block_linears}

    def peft(name: str, base: int, nbytes: int, width: int = 0) -> int:
        """peft's lora.Linear.forward after the base layer's output `base` (of `nbytes`), as it runs with nothing
        saved (the first pass of non-reentrant checkpointing: the saved tensors are dropped, so each goes when
        Python drops it): x cast to the adapter's fp32 (the local `x`, alive until forward returns); lora_A's output
        (gone once lora_B has read it); lora_B's output, times the scaling, plus the base output, in fp32, each
        freeing the one before (and the base output once `result` is rebound); the sum cast back, the linear's
        output. The recorded history of qwen3-8b LoRA + checkpointing (lora_qwen3_8b_ckpt): a 192 MiB fp32 copy
        of down_proj's input per layer at 4096 tokens, whose freed blocks take the checkpointed layer outputs.
        `width`: the input's, where two linears share a name (GPT-2's attention and MLP c_proj)."""
        if name not in adapted:
            return base
        if ctx.dt.lora16:
            return peft_16(base, nbytes)
        if adapter_casts is not None:
            return peft_autocast(name, base, nbytes, adapter_casts)
        out = nbytes // e * 4
        x32 = prog.alloc("activations", T * (width or in_features[name]) * 4)
        lora_a = prog.alloc("activations", T * ctx.w.lora_r * 4)
        total = lora_update(prog, lora_a, out, out, base)
        result = prog.alloc("activations", nbytes)
        prog.free(total)
        prog.free(x32)
        return result

    def peft_16(base: int, nbytes: int) -> int:
        """The same with 16-bit adapters (--lora-dtype bf16): lora_A reads x as it is; lora_A's output, lora_B's,
        times the scaling, plus the base output, each freeing the one before."""
        lora_a = prog.alloc("activations", T * ctx.w.lora_r * e)
        return lora_update(prog, lora_a, nbytes, nbytes, base)

    def peft_autocast(name: str, base: int, nbytes: int, cached: list[int]) -> int:
        """The same under autocast over 16-bit weights (the recorded history ac_lora_llama8b_ckpt_b4): x cast to
        fp32 (peft), A's weight copy (cached), x cast back to 16 bits for lora_A (gone once lora_A has run), lora_A's
        output, B's weight copy (cached), then lora_B's output, times the scaling, plus the base output, in 16 bits:
        the sum is the output; the fp32 x goes last."""
        width, rank = in_features[name], ctx.w.lora_r
        out = nbytes // e
        x32 = prog.alloc("activations", T * width * 4)
        cached.append(prog.alloc("activations", rank * width * e))
        x16 = prog.alloc("activations", T * width * e)
        lora_a = prog.alloc("activations", T * rank * e)
        prog.free(x16)
        cached.append(prog.alloc("activations", out // T * rank * e))
        total = lora_update(prog, lora_a, nbytes, nbytes, base)
        prog.free(x32)
        return total

    def lora_linear(name: str, nbytes: int) -> int:
        """A linear's output with no autocast: a 4-bit weight dequantized around the matmul, then peft's adapter."""
        if quantized and name in weights:  # the 4-bit weight dequantized around the matmul (nf4.py)
            return peft(name, nf4.forward_output(prog, weights[name] // 2, e, nbytes), nbytes)
        return peft(name, prog.alloc("activations", nbytes), nbytes)

    def project(name: str, nbytes: int, cast_input: bool) -> int:
        """A projection's output; under autocast its weight's bf16 copy (cached) and its input's bf16 cast."""
        if casts is None:
            return lora_linear(name, nbytes)
        copy = prog.alloc("autocast_weight_copies", weights.get(name, 0))
        cast = prog.alloc("activations", T * h * 2) if cast_input else 0
        out = prog.alloc("activations", nbytes)
        prog.free(cast)
        if cache_casts:
            casts.append(copy)
        else:
            prog.free(copy)
        return out

    q_w = spec.heads * (spec.qk_nope_dim + spec.qk_rope_dim) if spec.mla else spec.heads * spec.head_dim
    k_w = q_w if spec.mla else spec.kv_heads * spec.head_dim
    v_w = spec.heads * spec.v_head_dim if spec.mla else k_w
    out_w = spec.heads * (spec.v_head_dim or spec.head_dim)
    width, fan = mlp_width(spec, layer)

    gemma_norm = spec.model_type in GEMMA_FAMILY  # x.float() ... * (1 + weight), .type_as(x)
    # Gemma 2 and 3 also normalise the attention's and the MLP's outputs before each residual add (post_attention_
    # and post_feedforward_layernorm; pre_feedforward_layernorm is the MLP's input norm): the recorded histories
    # h47_gen_gemma2b_eager_b16, h37_prefill_gemma2_27b_b2 and h48_gen_gemma3_* show four norms a layer (with two,
    # gemma-2-2b eager generation was -5.2% reserved, now -0.0%; gemma-3-4b generation allocated -1.1% -> -0.0%)
    post_norms = spec.norms_per_layer == 4 and spec.model_type in GEMMA_FAMILY

    def norm() -> int:
        return rms_norm_nograd(prog, T, h, r, gemma=gemma_norm)

    def head_norm(src: int, width: int) -> int:
        """Qwen3's q_norm / k_norm: RMSNorm over each head of a projection's output, which then goes (the recorded
        history of qwen3-4b generation at batch 64 x 1024, gen_qwen3_4b_b64: the fp32 copy of q, its square and
        normalised product are q-sized fp32 tensors, 1 GiB each there)."""
        if not spec.qk_norm:
            return src
        out = rms_norm_nograd(
            prog, T * width // spec.head_dim, spec.head_dim, e, gemma=spec.model_type == "gemma3_text"
        )
        prog.free(src)
        return out

    def rotated(width: int) -> int:
        # fp32 products under autocast (RoPE multiplies the bf16 q and k by fp32 cos and sin)
        out = rope(prog, T, width, e, product=4 if autocast else e)
        if spec.model_type == "phi3":
            # phi-3's apply_rotary_pos_emb concatenates the rotated part with the pass-through part (empty when
            # all of the head rotates): one more copy (the recorded history of gen_phi3_b104)
            whole = prog.alloc("activations", T * width * e)
            prog.free(out)
            out = whole
        return out

    if spec.model_type == "gpt2":
        return gpt2_block_nograd(prog, ctx, x, cache_kv, keep_input, peft)
    if spec.model_type == "gpt_neox" and spec.parallel_residual:
        return neox_block_nograd(prog, ctx, x, cache_kv, keep_input, lora_linear)
    if spec.mla:
        return _mla_block_nograd(prog, ctx, x, layer, cache_kv, keep_input, decode, context or T)
    normed = norm()
    # phi-3's fused qkv_proj: q, k and v are views of one output, alive until v is rebound to the cache's copy
    fused_qkv = any(lin.name.endswith("qkv_proj") for lin in spec.block_linears)
    if fused_qkv:
        qkv_bytes = T * (q_w + k_w + v_w) * e
        qkv = project("qkv_proj", qkv_bytes, True)
        q = k = v = 0
    else:
        qkv = 0
        # Gemma 3 projects q, k and v first, then runs q_norm and k_norm (h48_gen_gemma3_4b_b8)
        if spec.model_type == "gemma3_text":
            q, k, v = (project(n, T * wd * e, True) for n, wd in (("q_proj", q_w), ("k_proj", k_w), ("v_proj", v_w)))
            q, k = head_norm(q, q_w), head_norm(k, k_w)
        else:  # Qwen3: q_norm(q_proj(x)), k_norm(k_proj(x)), v_proj(x)
            q = head_norm(project("q_proj", T * q_w * e, True), q_w)
            k = head_norm(project("k_proj", T * k_w * e, True), k_w)
            v = project("v_proj", T * v_w * e, True)
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
        if autocast:  # SDPA under autocast: the fp32 rotated k and q cast to bf16 for the kernel
            math_tmps += [prog.alloc("activations", T * k_w * e), prog.alloc("activations", T * q_w * e)]
        mask_float = 0
        if masked_attention(ctx.backend, ctx.mask, spec, layer) and ctx.w.batch < T:
            # a sliding-window mask: transformers repeats K and V to every head (no enable_gqa with a mask) and the
            # memory-efficient kernel takes the boolean mask as a [B, 1, S, S] tensor in the model's dtype
            # (h48_gen_gemma3_4b_b8: 128 + 128 + 256 MiB at 8 x 4096 for gemma-3-4b's sliding layers); a global layer
            # has no mask (is_causal) and the flash kernel (h48_gen_gemma3_1b_b16_s4096)
            if 1 < spec.kv_heads < spec.heads:  # one K/V head repeats as a stride-0 view (gemma-3-1b: no copy)
                math_tmps += [prog.alloc("activations", T * q_w * e), prog.alloc("activations", T * out_w * e)]
            mask_float = prog.alloc("activations", T * ctx.w.seq * e)
        attn = prog.alloc("activations", T * out_w * e)
        prog.free(mask_float)
        if autocast and not cache_kv:
            prog.transient("activations", T * spec.heads * 4)  # the kernel's log-sum-exp, before the casts go
        prog.free_all(math_tmps[::-1] if autocast else math_tmps)
        if not cache_kv and not autocast:
            # the kernel's log-sum-exp; in inference the H200's kernel writes none (gen_llama1b_fp16: the attention
            # output and three tiny philox/stat tensors only)
            prog.transient("activations", T * spec.heads * 4)
    # a decode step's own K and V go once the cache has made the longer tensors; in a checkpointed layer's first
    # pass (no cache) the rotated q and k and v are locals of the attention module (transformers' Qwen3Attention /
    # LlamaAttention.forward: query_states, key_states, value_states) and go when it returns, after o_proj and the
    # attention output, in that order (the recorded H200 history qwen3_8b_lora_ckpt_s2048_b5_cap40: o_proj's
    # result, then the attention output, q, k and v freed, then the norm's output)
    locals_kept = not cache_kv and not autocast and not decode
    if not cache_kv and not autocast and decode:
        prog.free(k2)
        prog.free(v)
    o = project("o_proj", T * h * e, False)
    if autocast and not cache_kv:  # the attention's inputs go once o_proj has run (the recorded order)
        prog.free(attn)
        attn = 0
        prog.free(q2)
        q2 = 0
        prog.free(k2)
        prog.free(v)
    prog.free(attn)
    if locals_kept:
        prog.free(q2)
        q2 = 0
        prog.free(k2)
        prog.free(v)
    prog.free(qkv)  # a fused projection's output is a local of the attention module: it goes when that returns
    prog.free(q2)
    prog.free(normed)
    if post_norms:  # post_attention_layernorm(o), then o goes (rebound)
        post = norm()
        prog.free(o)
        o = post
    x2 = prog.alloc("activations", T * h * r)
    prog.free(o)
    normed = norm()
    Tm = T * fan
    if (
        spec.experts
        and layer >= spec.dense_layers
        and (spec.model_type == "llama4_text" or spec.model_type in EXPERTS_INTERFACE_TYPES)
    ):
        down = _moe_nograd(prog, ctx, decode)
    elif any(lin.name.endswith("gate_up_proj") for lin in spec.block_linears):
        # phi-3: gate and up are chunks (views) of one output, alive until the MLP returns; silu(gate), the product
        fused = project("gate_up_proj", 2 * Tm * width * e, True)
        act = prog.alloc("activations", Tm * width * e)
        prod = prog.alloc("activations", Tm * width * e)
        prog.free(act)
        down = project("down_proj", T * h * e, False)
        prog.free(prod)
        prog.free(fused)
    else:
        gate = project("gate_proj", Tm * width * e, True)
        act = prog.alloc("activations", Tm * width * e)
        prog.free(gate)
        if spec.gated_mlp:
            up = project("up_proj", Tm * width * e, True)
            prod = prog.alloc("activations", Tm * width * e)
            prog.free(act)
            prog.free(up)
        else:  # gpt_neox: fc, GELU
            prod = act
        down = project("down_proj", T * h * e, False)
        prog.free(prod)
    prog.free(normed)
    if post_norms:  # post_feedforward_layernorm(down), then down goes
        post = norm()
        prog.free(down)
        down = post
    x3 = prog.alloc("activations", T * h * r)
    prog.free(down)
    prog.free(x2)
    # eager attention's probabilities come back to the decoder layer as its `_` (`hidden_states, _ =
    # self.self_attn(...)` in every transformers decoder layer): a local that goes when the layer returns, after the
    # residual (the recorded H200 history h44_lora_qwen7b_eager_ckpt_b3_cap40: the 2.6 GiB probabilities of a
    # checkpointed layer's first pass live through its MLP; freed after o_proj before, batch 3 on a 40 GiB card was
    # predicted to fit and failed at its logits)
    prog.free(probs)
    if not keep_input:
        prog.free(x)  # the caller's loop variable holds the layer's input until the layer returns
    return x3, kept


def _mla_block_nograd(
    prog: Program, ctx: Ctx, x: int, layer: int, cache_kv: bool, keep_input: bool, decode: bool, context: int
) -> tuple[int, list[int]]:
    """A DeepSeek-V2/V3 layer without autograd as transformers 5.x runs it (DeepseekV3Attention; the recorded
    history of DeepSeek-V3 generation): q through q_a_proj, its RMSNorm and q_b_proj (or q_proj); the compressed
    latent (kv_a_proj_with_mqa), its RMSNorm and the interleaved RoPE on the rotary parts; the cache keeps the
    latent (kv_lora_rank + qk_rope_head_dim per token, one head) and every step expands all `context` cached
    tokens again: kv_b_proj's output, the keys (a new tensor, nope and rope parts copied in), V made contiguous by
    SDPA, the output; then the MLP (dense, or the MoE of memory/moe.py). Returns the new residual's handle and
    the layer's cache tensors (with cache_kv)."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r, a = spec.hidden, dt.act, dt.resid, spec.heads
    nope, rot, vd, klr = spec.qk_nope_dim, spec.qk_rope_dim, spec.v_head_dim, spec.kv_lora_rank
    alloc, free = prog.alloc, prog.free
    normed = rms_norm_nograd(prog, T, h, r)
    if spec.q_lora_rank:
        qa = alloc("activations", T * spec.q_lora_rank * e)
        qn = rms_norm_nograd(prog, T, spec.q_lora_rank, r)
        free(qa)
        q = alloc("activations", T * a * (nope + rot) * e)
        free(qn)
    else:
        q = alloc("activations", T * a * (nope + rot) * e)
    latent = alloc("activations", T * (klr + rot) * e)
    kv_nope = rms_norm_nograd(prog, T, klr, r)
    # apply_rotary_pos_emb_interleave: the even/odd halves times cos and sin, concatenated
    prog.transient("activations", *[T * a * rot * e // 2] * 4)
    q_rot = alloc("activations", T * a * rot * e)
    k_rot = alloc("activations", T * rot * e)
    free(latent)
    kept = [kv_nope, k_rot] if cache_kv else []
    query = alloc("activations", T * a * (nope + rot) * e)  # torch.cat((q_pass, q_rot))
    C = context
    kvb = alloc("activations", C * a * (nope + vd) * e)  # kv_b_proj over every cached token
    key = alloc("activations", C * a * (nope + rot) * e)  # new_empty, k_nope and k_rot copied in
    v = alloc("activations", C * a * vd * e)  # SDPA's contiguous V
    attn = alloc("activations", T * a * vd * e)
    free(v)
    o = alloc("activations", T * h * e)
    prog.free_all([attn, query, q_rot, q, key, kvb, normed])
    if not cache_kv:
        prog.free_all([kv_nope, k_rot])
    x2 = alloc("activations", T * h * r)
    free(o)
    normed = rms_norm_nograd(prog, T, h, r)
    if spec.experts and layer >= spec.dense_layers:
        down = _moe_nograd(prog, ctx, decode)
    else:
        i = spec.intermediate
        gate = alloc("activations", T * i * e)
        act = alloc("activations", T * i * e)
        free(gate)
        up = alloc("activations", T * i * e)
        prod = alloc("activations", T * i * e)
        prog.free_all([act, up])
        down = alloc("activations", T * h * e)
        free(prod)
    free(normed)
    x3 = alloc("activations", T * h * r)
    prog.free_all([down, x2])
    if not keep_input:
        free(x)
    return x3, kept


def _moe_nograd(prog: Program, ctx: Ctx, decode: bool) -> int:
    """An MoE layer's MLP without autograd: the routed experts (memory/moe.py; generate()'s decode steps run
    batched_mm), then the shared expert on the same input, added. Qwen2-MoE runs its shared expert first, then the
    routed experts, then `sigmoid(shared_expert_gate(x)) * shared output` and the sum (its training history
    h46_lora_qwen15moe_b4). Returns the MLP output's handle."""
    spec, T, e = ctx.spec, ctx.tokens, ctx.dt.act
    h = spec.hidden
    ends: list[int] = []

    def routed_experts() -> int:
        nonlocal ends
        if spec.model_type == "llama4_text":
            out, ends = llama4_experts_nograd(prog, ctx, T)
            return out
        return batched_experts_decode(prog, ctx, T) if decode else grouped_experts_nograd(prog, ctx, T)

    def shared_expert() -> int:
        s = spec.shared_intermediate
        gate = prog.alloc("activations", T * s * e)
        act = prog.alloc("activations", T * s * e)
        prog.free(gate)
        up = prog.alloc("activations", T * s * e)
        prod = prog.alloc("activations", T * s * e)
        prog.free(act)
        prog.free(up)
        out = prog.alloc("activations", T * h * e)
        prog.free(prod)
        return out

    if spec.model_type == "qwen2_moe" and spec.shared_intermediate:
        shared = shared_expert()
        routed = routed_experts()
        gated = prog.alloc("activations", T * h * e)  # sigmoid(shared_expert_gate(x)) * shared output
        prog.free(shared)
        total = prog.alloc("activations", T * h * e)
        prog.free(routed)
        prog.free(gated)
        return total
    routed = routed_experts()
    if not spec.shared_intermediate:
        return routed
    out = shared_expert()
    if spec.model_type == "llama4_text":
        # out.add_(routed_out.reshape(E, T, h).sum(dim=0)): the sum's fp32 accumulation and its bf16 result
        prog.transient("activations", T * h * e, T * h * 4)
    else:
        total = prog.alloc("activations", T * h * e)  # routed + shared_experts(residuals)
        prog.free(out)
        out = total
    prog.free(routed)
    prog.free_all(ends)
    return out
