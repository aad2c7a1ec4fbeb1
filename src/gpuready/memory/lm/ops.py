"""Ops shared by the language-model programs: the cuBLAS workspace, RMSNorm and eager attention without autograd,
the rotary tables and eager attention's mask.
"""

from __future__ import annotations

from gpuready.memory.lm.context import Ctx, softmax_upcast_copy
from gpuready.memory.program import Program

# PyTorch takes cuBLAS workspaces from the caching allocator, one per (handle, stream), kept for the process;
# 32 MiB each on Hopper (CUBLAS_WORKSPACE_CONFIG default :4096:8, aten/src/ATen/cuda/CublasHandlePool.cpp)
CUBLAS_WORKSPACE_BYTES = 32 * 1024**2


def rms_norm_nograd(prog: Program, tokens: int, h: int, r: int, gemma: bool = False) -> int:
    """LlamaRMSNorm without autograd as it runs: x.to(fp32) (a copy unless already fp32), pow(2), mean, + eps,
    rsqrt, x * rsqrt, .to(dtype), weight * y (the order of a traced run and of the recorded history of
    gen_llama1b_fp16). Gemma3RMSNorm (`gemma`) keeps the product in fp32: x.float(), the same normalisation, then
    `* (1.0 + weight.float())` in fp32 and `.type_as(x)` (transformers models/gemma3/modeling_gemma3.py).
    Returns the output's handle."""
    T = tokens
    x32 = prog.alloc("activations", T * h * 4) if r == 2 else 0
    sq = prog.alloc("activations", T * h * 4)
    mean = prog.alloc("activations", T * 4)
    prog.free(sq)
    eps = prog.alloc("activations", T * 4)
    rs = prog.alloc("activations", T * 4)
    prog.free(eps)
    y32 = prog.alloc("activations", T * h * 4)
    prog.free(rs)
    prog.free(x32)
    if gemma:
        scaled = prog.alloc("activations", T * h * 4)
        prog.free(y32)
        prog.free(mean)
        out = prog.alloc("activations", T * h * r) if r == 2 else scaled
        if r == 2:
            prog.free(scaled)
        return out
    yb = prog.alloc("activations", T * h * r) if r == 2 else 0
    out = prog.alloc("activations", T * h * r)
    prog.free(yb)
    prog.free(y32)
    prog.free(mean)
    return out


def rotary_tables(prog: Program, ctx: Ctx, batch: int, seq: int, first_matmul: bool) -> list[int]:
    """The rotary embedding's cos and sin for a forward pass, kept until it ends (LlamaRotaryEmbedding.forward, as
    the recorded history of gen_llama1b_fp16 shows it): inv_freq @ positions in fp32 (the first matmul of the
    job, which makes the forward's cuBLAS workspace), cat(freqs, freqs), cos() and sin() times the attention
    scaling, cast to the model's dtype. Returns the handles of cos and sin (none for GPT-2's learned positions)."""
    spec = ctx.spec
    if spec.model_type == "gpt2":
        if first_matmul:
            prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
        return []
    dim = spec.qk_rope_dim if spec.mla else spec.head_dim
    n = batch * seq * dim  # elements of cos (or sin)
    freqs = prog.alloc("activations", n * 2)  # (B, dim/2, S) fp32
    if first_matmul:
        prog.alloc("cublas_workspaces", CUBLAS_WORKSPACE_BYTES)
    emb = prog.alloc("activations", n * 4)
    tables = []
    for _ in ("cos", "sin"):
        t = prog.alloc("activations", n * 4)
        scaled = prog.alloc("activations", n * 4)
        prog.free(t)
        tables.append(scaled)
    out = [prog.alloc("activations", n * ctx.dt.act) for _ in tables]
    prog.free(freqs)
    prog.free(emb)
    prog.free_all(tables)
    return out


def eager_mask(prog: Program, ctx: Ctx, batch: int, seq: int) -> int:
    """The float mask eager attention adds to its scores, built once per forward (transformers masking_utils
    `eager_mask`: the causal boolean [1, 1, S, S], expanded to the batch, then torch.where(mask, 0, min) in the
    model's dtype: [B, 1, S, S]). Returns its handle (0 for the SDPA kernels, which take is_causal)."""
    if ctx.backend != "eager":
        return 0
    causal = prog.alloc("activations", seq * seq)
    mask = prog.alloc("activations", batch * seq * seq * ctx.dt.param)
    prog.free(causal)
    return mask


def eager_nograd(prog: Program, ctx: Ctx, q_w: int, k_w: int, v_w: int, out_w: int) -> tuple[int, int]:
    """transformers' eager_attention_forward without autograd, in the order it allocates: K and V repeated to
    every head (repeat_kv), q @ k^T, `* scaling`, `+ mask`, softmax in fp32 (with bf16's upcast copy),
    `.to(dtype)` (the probabilities, returned as attn_weights and so alive until the attention module returns),
    probabilities @ v and its transpose(1, 2).contiguous(). Returns the handles of attention's output and of the
    probabilities."""
    spec, e, T = ctx.spec, ctx.dt.act, ctx.tokens
    kv_len = ctx.w.seq if ctx.w.batch * ctx.w.seq == T else 1
    scores = T * spec.heads * kv_len  # elements: batch * heads * query * key
    kq = prog.alloc("activations", T * q_w * e) if k_w < q_w else 0
    vq = prog.alloc("activations", T * out_w * e) if v_w < out_w else 0
    mm = prog.alloc("activations", scores * e)
    scaled = prog.alloc("activations", scores * e)
    prog.free(mm)
    masked = prog.alloc("activations", scores * e)
    prog.free(scaled)
    up = prog.alloc("activations", scores * 4) if softmax_upcast_copy(ctx) else 0
    sm = prog.alloc("activations", scores * 4)
    prog.free(up)
    probs = prog.alloc("activations", scores * e)
    prog.free(sm)
    prog.free(masked)
    av = prog.alloc("activations", T * out_w * e)
    out = prog.alloc("activations", T * out_w * e)  # transpose(1, 2).contiguous()
    prog.free(av)
    prog.free(kq)
    prog.free(vq)
    return out, probs
