"""Ops written once for every language-model block: the rotary embedding, RMSNorm's pieces under autograd, RMSNorm
and eager attention without autograd, the rotary tables, eager attention's mask and the cuBLAS workspace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuready.memory.lm.autograd import Layer
from gpuready.memory.lm.context import GEMMA_FAMILY, Ctx, softmax_upcast_copy
from gpuready.memory.program import Program
from gpuready.memory.template import Batch, PerBatch
from gpuready.models.spec import ModelSpec
from gpuready.units import MIB

# PyTorch takes cuBLAS workspaces from the caching allocator, one per (handle, stream), kept for the process;
# 32 MiB each on Hopper (CUBLAS_WORKSPACE_CONFIG default :4096:8, aten/src/ATen/cuda/CublasHandlePool.cpp)
CUBLAS_WORKSPACE_BYTES = 32 * MIB


def rope(prog: Program, tokens: int, width: int, act: int, output: bool = True, product: int | None = None) -> int:
    """The rotary embedding on q (or k) as transformers' apply_rotary_pos_emb runs it, `q * cos + rotate_half(q) *
    sin`: the product with cos, rotate_half's -x2 and torch.cat, its product with sin, then the sum (the rotated
    tensor) and the two products freed. Returns the sum's handle; with output=False the sum is left out (0 is
    returned): the generic training layer keeps its rotated q and k with the attention kernel's inputs instead.
    `product`: bytes per element of the two products and the sum when they differ from the input's (4 under
    autocast, where cos and sin are fp32)."""
    n = tokens * width * act
    p = tokens * width * (act if product is None else product)
    cos_part = prog.alloc("activations", p)
    neg = prog.alloc("activations", n // 2)
    cat = prog.alloc("activations", n)
    prog.free(neg)
    sin_part = prog.alloc("activations", p)
    prog.free(cat)
    out = prog.alloc("activations", p) if output else 0
    prog.free(cos_part)
    prog.free(sin_part)
    return out


def rope_backward(prog: Program, nbytes: int, grad: int) -> int:
    """RoPE's backward (q * cos + rotate_half(q) * sin) from the rotated tensor's gradient `grad`, which it frees,
    where q is `nbytes` and nothing is cast (its dtype the products'): the products with cos and sin, rotate_half's
    gradient; returns the gradient of q (the recorded histories qwen3_8b_lora_ckpt_s2048_b5_cap40 in 16 bits,
    h52_ft_qwen3_4b_mixed_b1 and the kbit-prep ones in fp32)."""
    t1 = prog.alloc("activations", nbytes)
    t2 = prog.alloc("activations", nbytes // 2)
    out = prog.alloc("activations", nbytes)
    prog.free(t2)
    t4 = prog.alloc("activations", nbytes)
    prog.free(t1)
    prog.free(t4)
    t5 = prog.alloc("activations", nbytes)
    prog.free(grad)
    prog.free(t5)  # added into `out`
    return out


def rms_norm_start(
    layer: Layer, tokens: int, width: int, act: int, rows: int = 0, stats: list[int] | None = None
) -> int:
    """The start of LlamaRMSNorm (and its relatives) under autograd on a 16-bit input: x.to(fp32), kept by pow (its
    backward makes an input-sized gradient and holds three fp32 temporaries of the input's size); pow(2), freed at
    once; x * rsqrt in fp32. Returns the handle of x * rsqrt, which the caller frees or keeps.

    With `stats` (a list), the per-row tensors are made too, as the recorded history of qwen3-8b LoRA
    (qwen3_8b_lora_ckpt_s2048_b5_cap40) shows them for Qwen3's head norms, where `rows` = tokens x heads makes them
    large-pool blocks (1.25 MiB for q at 10240 tokens): the mean (the local `variance`, alive until the norm
    returns), + eps (freed), rsqrt (kept by x * rsqrt); the handles of x.to(fp32), rsqrt and the mean are appended to
    `stats` (the caller frees the mean when the norm returns)."""
    n = tokens * width
    x32 = layer.alloc(n * 4)
    layer.keep_handle(x32, n * act, transient=(n * 4,) * 3)
    sq = layer.alloc(n * 4)
    if stats is None:
        layer.prog.free(sq)
        return layer.alloc(n * 4)
    mean = layer.alloc(rows * 4)
    layer.prog.free(sq)
    eps = layer.alloc(rows * 4)
    rsqrt = layer.alloc(rows * 4)
    layer.keep_handle(rsqrt)
    layer.prog.free(eps)
    stats.extend((x32 if layer.keep else 0, rsqrt if layer.keep else 0, mean))
    return layer.alloc(n * 4)


def rms_norm_frozen(layer: Layer, y32: int, tokens: int, width: int, dtype: int) -> int:
    """The end of the norm when its weight does not train (nothing more is kept): .to(dtype), weight * y, then
    x * rsqrt (`y32`, from rms_norm_start) and the cast freed. Returns the output's handle."""
    yb = layer.alloc(tokens * width * dtype)
    out = layer.alloc(tokens * width * dtype)
    layer.prog.free(y32)
    layer.prog.free(yb)
    return out


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
    if ctx.w.kbit_prep and ctx.w.task == "train":  # the fp32 hidden states: cos.to(dtype) is cos itself
        prog.free(freqs)
        prog.free(emb)
        return tables
    out = [prog.alloc("activations", n * ctx.dt.act) for _ in tables]
    prog.free(freqs)
    prog.free(emb)
    prog.free_all(tables)
    return out


def embedding_output(prog: Program, ctx: Ctx, nbytes: int) -> int:
    """The embedding's output, the residual stream's first tensor. Gemma 2 and 3 scale it by sqrt(hidden) into a new
    tensor and the unscaled one goes (lora_gemma2_2b, h47_gen_gemma2b_eager_b16, h48_gen_gemma3_*: two
    embedding-sized blocks, the first freed at once)."""
    if ctx.spec.model_type not in GEMMA_FAMILY:
        return prog.alloc("activations", nbytes)
    raw = prog.alloc("activations", nbytes)
    out = prog.alloc("activations", nbytes)
    prog.free(raw)
    return out


def eager_mask(prog: Program, ctx: Ctx, batch: int, seq: int) -> list[int]:
    """The float masks eager attention adds to its scores, built once per forward (transformers masking_utils
    `eager_mask`: the causal boolean [1, 1, S, S] expanded to the batch, then torch.where(mask, 0, min) in the
    model's dtype: [B, 1, S, S]). Under generate() the attention mask it passes is and-ed in, which makes the
    boolean batch-sized first (h47_gen_gemma2b_eager_b16: 16 MiB at 16 x 1024). Gemma 2 and 3 build a causal and a
    sliding-window mask, both kept (the same history: two 32 MiB masks; -0.4% allocated with one). Returns their
    handles (none for the SDPA kernels, which take is_causal)."""
    if ctx.backend != "eager":
        return []
    padded = ctx.w.new_tokens > 0
    masks = []
    for _ in range(2 if ctx.spec.model_type in GEMMA_FAMILY else 1):
        boolean = prog.alloc("activations", seq * seq)
        if padded:  # and-ed with generate()'s attention mask: batch-sized
            expanded = prog.alloc("activations", batch * seq * seq)
            prog.free(boolean)
            boolean = expanded
        masks.append(prog.alloc("activations", batch * seq * seq * ctx.dt.param))
        prog.free(boolean)
    return masks


def sliding_mask(prog: Program, seq: int, batch: int, padded: bool) -> int:
    """SDPA's boolean sliding-window mask as transformers' masking_utils builds it (sdpa_mask's and_masks over the
    window's and the causal functions): the window's [S, S] and its `and` copy, the causal [S, S] and the `and` of
    both (kept), each intermediate freed after the next; under generate() and-ed once more and then with the padding
    mask, which makes it batch-sized (h55_ft_mistral7b_ckpt_b1_s8192: four 64 MiB steps at 8192, one kept until the
    backward is done; h48_gen_gemma3_1b_b8: 4 MiB steps, a 32 MiB mask at 8 x 2048). Returns the kept mask's
    handle."""
    square = seq * seq
    window = prog.alloc("activations", square)
    first = prog.alloc("activations", square)
    prog.free(window)
    causal = prog.alloc("activations", square)
    mask = prog.alloc("activations", square)
    prog.free(causal)
    prog.free(first)
    if padded:
        again = prog.alloc("activations", square)
        prog.free(mask)
        mask = prog.alloc("activations", batch * square)
        prog.free(again)
    return mask


def training_masks(prog: Program, ctx: Ctx) -> list[int]:
    """The masks a training forward builds after the embedding and keeps until the backward has left the first
    layer: eager attention's float mask (h45_eager_ckpt_qwen15b_b2, h44_lora_qwen7b_eager_ckpt_b2: the causal
    boolean, the [B, 1, S, S] mask, the boolean freed), or past a sliding window SDPA's boolean one
    (h55_ft_mistral7b_ckpt_b1_s8192)."""
    masks = eager_mask(prog, ctx, ctx.w.batch, ctx.w.seq)
    if ctx.mask and ctx.backend != "eager":
        masks.append(sliding_mask(prog, ctx.w.seq, ctx.w.batch, padded=False))
    return masks


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
    # matmul's contiguous copy of the rotated q (RoPE's output keeps the projection's token-major strides, which
    # bmm cannot take past one sequence: eager.strided_copies), freed once the scores are made (inf_llama1b_eager,
    # h45_eager_ckpt_qwen15b_b2); without grouped-query heads k's too (and v's before the product); a decode step's
    # single query needs none, and its K and V are the cache's contiguous concatenation
    copies = kv_len > 1 and prog.from_batch(ctx.w.batch, 2)
    qc = prog.alloc("activations", T * q_w * e) if copies else 0
    kc = prog.alloc("activations", T * q_w * e) if copies and not kq else 0
    mm = prog.alloc("activations", scores * e)
    prog.free(qc)
    prog.free(kc)
    scaled = prog.alloc("activations", scores * e)
    prog.free(mm)
    if spec.attn_softcap:  # Gemma 2: / cap, tanh, * cap, each rebinding the scores (the one before goes)
        for _ in range(3):
            capped = prog.alloc("activations", scores * e)
            prog.free(scaled)
            scaled = capped
    masked = prog.alloc("activations", scores * e)
    prog.free(scaled)
    shifted = 0
    if spec.attn_sinks:
        probs, shifted = _sinks_softmax_nograd(prog, ctx, scores)
    else:
        up = prog.alloc("activations", scores * 4) if softmax_upcast_copy(ctx) else 0
        sm = prog.alloc("activations", scores * 4)
        prog.free(up)
        probs = prog.alloc("activations", scores * e)
        prog.free(sm)
    prog.free(masked)
    vc = prog.alloc("activations", T * out_w * e) if copies and not vq else 0
    av = prog.alloc("activations", T * out_w * e)
    prog.free(vc)
    out = prog.alloc("activations", T * out_w * e)  # transpose(1, 2).contiguous()
    prog.free(av)
    prog.free(kq)
    prog.free(vq)
    prog.free(shifted)
    return out, probs


def _sinks_softmax_nograd(prog: Program, ctx: Ctx, scores: int) -> tuple[int, int]:
    """gpt-oss's eager attention from the masked scores to its probabilities, as the recorded history
    h42_gen_gptoss20b_b4 makes it: the scores concatenated with each head's sink (one column more), their row max
    (values, int64 indices and the reduction's 16-byte pairs a moment), the max subtracted, softmax in the scores'
    own dtype (no fp32 upcast). Returns the probabilities' handle (probabilities[..., :-1] is a view of them) and the
    shifted scores', which live until the attention's output is made."""
    e = ctx.dt.act
    rows = ctx.tokens * ctx.spec.heads  # batch * heads * query
    alloc, free = prog.alloc, prog.free
    combined = alloc("activations", (scores + rows) * e)
    top, where = alloc("activations", rows * e), alloc("activations", rows * 8)
    prog.transient("activations", rows * 16)
    free(where)
    shifted = alloc("activations", (scores + rows) * e)
    free(top)
    free(combined)
    return alloc("activations", (scores + rows) * e), shifted


# SMs of the measured card (H200/H100 SXM: 132); the reduction kernel sizes its global buffer by it (below)
REDUCE_SMS = 132
REDUCE_THREADS_PER_SM = 2048  # an SM's resident threads (maxThreadsPerMultiProcessor) on sm_80 and later


def _last_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


@dataclass(frozen=True)
class _ReduceAt:
    """reduce_buffer_bytes of `outputs` over `a * batch + c` rows, as a function of the batch (equal by value, so
    that two recordings of one template compare equal)."""

    outputs: int
    a: int
    c: int
    sms: int

    def __call__(self, batch: int) -> int:
        nbytes: int = reduce_buffer_bytes(self.outputs, self.a * batch + self.c, self.sms)
        return nbytes


def reduce_buffer_bytes(outputs: int, rows: Any, sms: int = REDUCE_SMS) -> Any:
    """The global staging buffer of a CUDA sum over `rows` into `outputs` contiguous sums (a bias's or a norm
    weight's gradient), as ATen's Reduce.cuh (setReduceConfig) sizes it for a reduction over the slower dimension:
    outputs are read 4 at a time (when 4 divides them), a block is `width` output lanes x `height` rows of threads
    (set_block_dimension: at most 512 / 4 threads), and when each thread would still sum at least 256 values and the
    grid of ceil(outputs / 4 / width) blocks is at most the card's resident blocks (SMs x 2048 / threads), the rows
    are split over ctas_per_output = max(min(ceil(resident / grid), ceil(values / 16)), ceil(values / 256)) blocks,
    values = ceil(rows / height), each keeping one fp32 partial per (output, lane): 4 x outputs x ctas x width x 4
    bytes. The recorded H200 histories show it after every such gradient: 128 MiB for 2048 outputs over 8192 rows and
    132 MiB for 6144 or 8192 outputs (ft_pythia1b_b8), 64 MiB for 1024 outputs (ft_pythia410m_b8), 132 MiB for 2048
    outputs over 32768 rows (ft_llama1b_mixed_ckpt_s4096), 132 MiB (138,412,032 and 139,198,464 B) for GPT-2's 3072
    and 2304 bias outputs over 8192 rows (ac_gpt2_full_b8), 132 MiB for ViT-B's 768 over 25,216 rows
    (h30_hf_vitb_bf16_b128). Zero when no global reduction is made.

    Never falls as `rows` grows: below 128 rows it is zero (fewer than 256 values per thread); from 128 the block's
    shape no longer depends on the rows, the values per thread and so the blocks per output only grow, and each
    condition for a zero (too few values, one block per output) holds below a threshold only. So with the rows a
    batch-template symbol (template.Batch) it is a template.PerBatch, worked out at each batch the template writes."""
    if isinstance(rows, Batch):
        return PerBatch(_ReduceAt(outputs, rows.a, rows.c, sms))
    if outputs < 1 or rows < 1:
        return 0
    vec = 4
    while outputs % vec:
        vec //= 2
    lanes_max = 512 // vec
    dim0 = outputs // vec
    p0 = _last_pow2(dim0) if dim0 < lanes_max else lanes_max
    p1 = _last_pow2(rows) if rows < lanes_max else lanes_max
    width = min(p0, 32)
    height = min(p1, lanes_max // width)
    width = min(p0, lanes_max // height)
    if rows < min(height * 16, 256):  # each warp keeps its own outputs: no split of the rows over blocks
        return 0
    values = -(-rows // height)
    grid = -(-dim0 // width)
    resident = sms * (REDUCE_THREADS_PER_SM // (width * height))
    if values < 256 or grid > resident:
        return 0
    ctas = max(min(-(-resident // grid), -(-values // 16)), -(-values // 256))
    return 4 * outputs * ctas * width * vec if ctas > 1 else 0


def flash_backward_workspace_bytes(spec: ModelSpec, tokens: int) -> int:
    """Flash attention's backward scratch, made and freed inside the kernel call: the fp32 dq accumulator and the
    softmax row sums (tokens x heads x (head_dim + 1) x 4), and with grouped-query heads the bf16 dk and dv expanded
    to every head before they are summed back (tokens x heads x head_dim x 2, twice). The recorded H200 histories:
    64.25 MiB for pythia-1b at 8 x 1024 (8 heads of 256, ft_pythia1b_b8), 516 MiB for llama-3.2-1b at 8 x 4096
    (32 heads of 64 over 8 K/V heads, ft_llama1b_mixed_ckpt_s4096), 321.25 MiB for qwen3-8b at 5 x 2048
    (qwen3_8b_lora_ckpt_s2048_b5_cap40)."""
    a, d = spec.heads, spec.head_dim
    gqa = 2 * tokens * a * d * 2 if spec.kv_heads < a else 0
    return tokens * a * (d + 1) * 4 + gqa + 256  # the kernel asks for 256 B more (all three histories)


def norm_backward_frozen(
    prog: Program,
    tokens: int,
    width: int,
    rows: int,
    act: int,
    g: int,
    x32: int,
    rsqrt: int = 0,
    also: list[int] | None = None,
) -> int:
    """The backward of an RMSNorm with a frozen weight (LlamaRMSNorm and its copies: `weight * (x.to(fp32) *
    rsqrt(mean(x^2) + eps)).to(dtype)`) from its output's gradient `g`, which it frees, as the recorded history
    shows it (the final norm, each layer's two norms, Qwen3's head norms): grad * weight, its cast to fp32; x *
    rsqrt's backward (grad * x, summed into rsqrt's gradient and freed, and grad * rsqrt, the first part of the
    input's fp32 gradient); rsqrt's and the mean's (row-sized); the mean's gradient expanded to the input's size;
    pow's backward (two temporaries and its part, added in place into the first); the saved fp32 copy `x32` (and
    `rsqrt`, and `also`: a checkpointed layer's saved inputs, which the checkpoint holds until here) freed; the
    cast back to `act` bytes, returned."""
    n = tokens * width
    alloc, free = prog.alloc, prog.free
    scaled = alloc("activations", n * act)  # grad * weight
    free(g)
    g32 = alloc("activations", n * 4)  # .to(dtype)'s backward
    free(scaled)
    by_x = alloc("activations", n * 4)  # grad * x, for rsqrt's gradient
    part = alloc("activations", n * 4)  # grad * rsqrt, the input's gradient so far
    g_rs = alloc("activations", rows * 4)
    free(by_x)
    free(g32)
    small = [alloc("activations", rows * 4) for _ in range(3)]  # rsqrt's and the mean's backward
    free(small[1])
    free(small[0])
    free(rsqrt)
    free(g_rs)
    expanded = alloc("activations", n * 4)  # the mean's gradient over the row
    free(small[2])
    t1, t2, pow_part = alloc("activations", n * 4), alloc("activations", n * 4), alloc("activations", n * 4)
    free(t2)
    free(t1)
    free(x32)
    free(expanded)
    prog.free_all(also or [])
    free(pow_part)  # added into `part`
    out = alloc("activations", n * act)  # x.to(fp32)'s backward
    free(part)
    return out


def lora_update(prog: Program, lora_a: int, branch_bytes: int, total_bytes: int, base: int) -> int:
    """peft's lora.Linear.forward after lora_A: lora_B's output (then `lora_a`, lora_A's output, goes when nothing
    keeps it: pass 0 when lora_B keeps it), times the scaling, plus the base output `base`, each freeing the one
    before; returns the sum (`total_bytes`)."""
    lora_b = prog.alloc("activations", branch_bytes)
    prog.free(lora_a)
    scaled = prog.alloc("activations", branch_bytes)
    prog.free(lora_b)
    total = prog.alloc("activations", total_bytes)
    prog.free(scaled)
    prog.free(base)
    return total
