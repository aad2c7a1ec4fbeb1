"""GPT-2's decoder block under autograd (full fine-tuning, with and without autocast) in the order recorded H200
allocator histories show it."""

from __future__ import annotations

from gpuready.memory.lm.autograd import Layer, Saved
from gpuready.memory.lm.context import Ctx
from gpuready.memory.lm.ops import reduce_buffer_bytes
from gpuready.memory.program import Program


def gpt2_embeddings(prog: Program, ctx: Ctx, r: int) -> tuple[int, int, int]:
    """GPT-2's embeddings in training, after the token embeddings (the embedding output): the positions' (alive
    until the base model returns), their sum (gone once dropout has run), dropout's one-byte mask (kept for its
    backward) and its output, the residual stream (h38_lora_gpt2m_ckpt_b16 under peft's checkpointing, where the
    token embeddings are held with the step's graph until the next step's; ft_gpt2xl_sgd otherwise). Returns
    (wpe, the dropout's mask, the residual stream)."""
    h, T = ctx.spec.hidden, ctx.tokens
    wpe = prog.alloc("activations", ctx.w.seq * h * r)
    summed = prog.alloc("activations", T * h * r)
    mask = prog.alloc("activations", T * h)
    x = prog.alloc("activations", T * h * r)
    prog.free(summed)
    return wpe, mask, x


def gpt2_embeddings_backward(prog: Program, ctx: Ctx, dx: int, mask: int, r: int) -> tuple[int, int]:
    """Full fine-tuning: the embedding dropout's backward (the residual gradient `dx` and the dropout's `mask` go),
    then the position embedding's: the gradient summed over the batch ([1, S, h]; none at batch 1), then wpe's
    .grad (h53_ft_gpt2l_fp32_b4, ft_gpt2xl_sgd, ft_gpt2m_fp16). Returns (the dropout's gradient, which the caller
    frees once the token embedding's gradient is made; wpe's gradient)."""
    h, w = ctx.spec.hidden, ctx.w
    grad = prog.alloc("activations", ctx.tokens * h * r)
    prog.free(dx)
    prog.free(mask)
    summed = prog.alloc("activations", w.seq * h * r) if prog.from_batch(w.batch, 2) else 0
    pos = prog.alloc("gradients", ctx.spec.learned_positions * h * ctx.dt.param)
    prog.free(summed)
    return grad, pos


def gpt2_block_forward(prog: Program, ctx: Ctx, keep: bool) -> list[Saved]:
    """GPT-2's block under full fine-tuning without autocast, in the order the recorded H200 history of
    gpt2-medium fp16 (docs/calibration/histories/ft_gpt2m_fp16.json.gz) shows: ln_1's output (kept by c_attn);
    c_attn's packed q/k/v (kept whole: attention keeps views of it); the attention output (kept by its backward
    and by c_proj); c_proj's output, resid_dropout's one-byte mask (kept) and output; the residual (kept by ln_2);
    then ln_2, c_fc (kept), gelu_new written out in Python (0.5*x, tanh and 1+tanh kept, the product kept by the
    second c_proj; x**3 and the sums between are temporaries), the second c_proj and dropout, and the residual
    (kept by the next block's ln_1). LayerNorm keeps its input: the residuals above."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r, width = spec.hidden, dt.act, dt.resid, spec.intermediate
    lins = {lin.name: lin for lin in spec.block_linears}
    layer_ = Layer(prog, keep)
    alloc, save = layer_.alloc, layer_.save

    def weight_grad(name: str) -> None:
        """The node where backward makes the Conv1D's weight gradient, then its bias's, whose sum over the tokens
        takes CUDA's reduction buffer for a moment (ft_gpt2xl_sgd: 50 MiB for c_fc's 6400 outputs and 37.5 MiB
        for c_attn's 4800 over 1024 tokens, each a new segment after the kept weight gradient took the last)."""
        lin = lins[name]
        # (a batch-template symbol when the template is recorded: passed as it is, zero or not at a given batch)
        reduce = (reduce_buffer_bytes(lin.out_features, T),) if lin.bias else ()
        layer_.weight_grad(lin.in_features * lin.out_features * dt.param, reduce)

    def proj_dropout(name: str) -> int:
        """c_proj's output through dropout: the mask is kept, the output returned."""
        weight_grad(name)
        out = alloc(T * h * e)
        save(T * h)  # dropout's mask, one byte per element
        dropped = alloc(T * h * e)
        prog.free(out)
        return dropped

    save(T * h * e, T * h * e)  # ln_1 output
    weight_grad("c_attn")
    save(T * 3 * h * e, T * 3 * h * e)  # packed q, k, v
    save(T * h * e, T * h * e)  # attention output
    save(T * spec.heads * 4)  # log-sum-exp
    attn_drop = proj_dropout("c_proj")
    save(T * h * r, T * h * e)  # residual, kept by ln_2
    save(T * h * e, T * h * e)  # ln_2 output
    weight_grad("c_fc")
    save(T * width * e, T * width * e)  # c_fc output, gelu_new's input
    save(T * width * e, T * width * e)  # 0.5 * x
    cube = alloc(T * width * e)  # x ** 3
    t = alloc(T * width * e)  # 0.044715 * x**3
    prog.free(cube)
    for _ in range(2):  # x + ..., sqrt(2/pi) * (...)
        t2 = alloc(T * width * e)
        prog.free(t)
        t = t2
    save(T * width * e, T * width * e)  # tanh(...), kept by its backward
    prog.free(t)
    save(T * width * e, T * width * e)  # 1 + tanh(...)
    save(T * width * e, T * width * e)  # the product, the second c_proj's input
    mlp_drop = proj_dropout("mlp.c_proj")
    save(T * h * r, T * h * e)  # residual, kept by the next block's ln_1
    prog.free(attn_drop)
    prog.free(mlp_drop)
    return layer_.finish()


def gpt2_block_forward_autocast(prog: Program, ctx: Ctx, residual_out: list[int] | None) -> list[Saved]:
    """GPT-2's block under full fine-tuning with autocast over 16-bit weights (--autocast), as the recorded H200
    history ac_gpt2_full_b8 shows it: each LayerNorm runs in fp32 (autocast's list) on an fp32 copy of its input,
    which it keeps with the mean and rstd (and autocast's fp32 copies of its weight and bias), and returns an fp32
    output that the next linear casts back to 16 bits and keeps; gelu_new's pow runs in fp32 on an fp32 copy of its
    input (kept), so the chain after it is fp32 (tanh and 1 + tanh kept; 0.5 * x stays 16-bit); the product is cast
    to 16 bits for the second c_proj (kept). The residuals are not kept (the norms keep their copies): the block's
    output goes to `residual_out` and the caller frees its input once the block has returned."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, width = spec.hidden, dt.act, spec.intermediate
    lins = {lin.name: lin for lin in spec.block_linears}
    layer_ = Layer(prog, True)
    alloc, save, free = layer_.alloc, layer_.save, prog.free

    def weight_grad(name: str) -> None:
        lin = lins[name]
        layer_.weight_grad(lin.in_features * lin.out_features * dt.param)

    def layer_norm() -> int:
        """The fp32 output's handle."""
        save(h * 4)  # autocast's fp32 copy of the weight (LayerNorm's backward reads it)
        save(h * 4)  # and of the bias (held by autocast's cache)
        save(T * h * 4, T * h * e)  # the input in fp32
        out = alloc(T * h * 4)
        save(T * 4)  # mean
        save(T * 4)  # rstd
        return out

    def proj_dropout(name: str) -> int:
        weight_grad(name)
        out = alloc(T * h * e)
        save(T * h)  # dropout's mask, one byte per element
        dropped = alloc(T * h * e)
        free(out)
        return dropped

    ln1 = layer_norm()
    weight_grad("c_attn")
    save(T * h * e, T * h * 4)  # c_attn's input cast to 16 bits, kept for the weight gradient
    save(T * 3 * h * e, T * 3 * h * e)  # packed q, k, v
    save(T * h * e, T * h * e)  # attention output
    save(T * spec.heads * 4)  # log-sum-exp
    attn_drop = proj_dropout("c_proj")
    resid = alloc(T * h * e)  # residual + attention
    free(ln1)
    ln2 = layer_norm()
    weight_grad("c_fc")
    save(T * h * e, T * h * 4)  # c_fc's input cast to 16 bits
    x = alloc(T * width * e)  # c_fc's output, gelu_new's input
    save(T * width * e, T * width * e)  # 0.5 * x
    save(T * width * 4, T * width * e)  # x in fp32, kept by pow
    cube = alloc(T * width * 4)  # x ** 3
    t = alloc(T * width * 4)  # 0.044715 * x ** 3
    free(cube)
    for _ in range(2):  # x + ..., sqrt(2 / pi) * (...)
        t2 = alloc(T * width * 4)
        free(t)
        t = t2
    save(T * width * 4, T * width * 4)  # tanh(...), kept by its backward
    free(t)
    save(T * width * 4, T * width * 4)  # 1 + tanh(...), kept by the product
    prod = alloc(T * width * 4)  # 0.5 * x * (1 + tanh(...)), fp32
    free(x)
    save(T * width * e, T * width * 4)  # the product cast to 16 bits, kept by the second c_proj
    weight_grad("mlp.c_proj")
    out = alloc(T * h * e)
    free(prod)
    save(T * h)  # dropout's mask
    mlp_drop = alloc(T * h * e)
    free(out)
    block_out = alloc(T * h * e)  # residual + MLP
    free(ln2)
    free(resid)
    free(attn_drop)
    free(mlp_drop)
    if residual_out is not None:
        residual_out.append(block_out)
    else:
        free(block_out)  # the caller's residual stream is modelled outside the layer
    return layer_.finish()
