"""GPT-2's and GPT-NeoX's decoder layers without autograd (inference, and the first pass of a checkpointed layer):
their own block structures beside the Llama-like one of blocks_infer.py."""

from __future__ import annotations

from collections.abc import Callable

from gpuready.memory.lm.context import Ctx
from gpuready.memory.lm.ops import rope
from gpuready.memory.program import Program


def neox_block_nograd(
    prog: Program, ctx: Ctx, x: int, cache_kv: bool, keep_input: bool, linear: Callable[[str, int], int]
) -> tuple[int, list[int]]:
    """GPTNeoXLayer without autograd, as transformers runs it: LayerNorm (one output), the fused query_key_value
    (q, k, v are views of it until the attention returns), rotary on the first rotary_dims of each head
    (q_rot * cos + rotate_half(q_rot) * sin, then torch.cat with the pass-through part), the cache's own copies of
    K and V, the kernel's output and its transposed copy, dense; then the parallel MLP on a second LayerNorm of the
    same input (dense_h_to_4h, GELU, dense_4h_to_h) and mlp + attention + input. `linear(name, bytes)`: a linear's
    output, through peft's adapter where it has one (a checkpointed LoRA layer's first pass: the recorded history
    h37_lora_pythia1b_ckpt_b8 shows each of the four linears' fp32 copy of its input and fp32 lora_B output)."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r = spec.hidden, dt.act, dt.resid
    w = spec.heads * spec.head_dim
    rot = spec.heads * (spec.rotary_dims or spec.head_dim)
    alloc, free = prog.alloc, prog.free

    ln1 = alloc("activations", T * h * r)
    qkv = linear("query_key_value", T * 3 * w * e)

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
    attn = linear("dense", T * h * e)
    free(out_t)
    free(q)
    free(k)
    free(qkv)
    free(ln1)
    ln2 = alloc("activations", T * h * r)
    fc = linear("dense_h_to_4h", T * spec.intermediate * e)
    act = alloc("activations", T * spec.intermediate * e)
    free(fc)
    mlp = linear("dense_4h_to_h", T * h * e)
    free(act)
    free(ln2)
    s1 = alloc("activations", T * h * r)  # mlp_output + attn_output
    if ctx.w.task == "train":
        # a checkpointed layer's first pass in train mode: the sum first, then the locals as forward returns
        # (h37_lora_pythia1b_ckpt_b8, h40_qlora_pythia1b_ckpt_b8: the partial sum, attn_output, mlp_output)
        x2 = alloc("activations", T * h * r)
        prog.free_all([s1, attn, mlp])
    else:
        free(mlp)
        free(attn)
        x2 = alloc("activations", T * h * r)  # ... + hidden_states
        free(s1)
    if not keep_input:
        prog.free(x)
    return x2, kept


def _gelu_new(prog: Program, nbytes: int, fc: int) -> int:
    """GPT-2's gelu_new written out in Python (0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3)))) over c_fc's output
    `fc` (of `nbytes`, gone at the end): its temporaries make the MLP's peak four such tensors. Returns the output."""
    half = prog.alloc("activations", nbytes)  # 0.5 * x
    cube = prog.alloc("activations", nbytes)  # x ** 3
    t = prog.alloc("activations", nbytes)  # 0.044715 * x**3
    prog.free(cube)
    for _ in range(4):  # x + ..., * sqrt(2/pi), tanh, 1 + ...: each replaces the last
        t2 = prog.alloc("activations", nbytes)
        prog.free(t)
        t = t2
    act = prog.alloc("activations", nbytes)
    prog.free(half)
    prog.free(t)
    prog.free(fc)
    return act


def gpt2_block_nograd(
    prog: Program, ctx: Ctx, x: int, cache_kv: bool, keep_input: bool, peft: Callable[[str, int, int, int], int]
) -> tuple[int, list[int]]:
    """GPT-2's block without autograd: LayerNorm, one packed q/k/v projection, learned positions (no RoPE),
    and gelu_new written out in Python (0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3)))), whose temporaries
    make the MLP's peak four intermediate-sized tensors. `peft`: an adapted Conv1D's output through peft's adapter
    (a checkpointed LoRA layer's first pass, as for GPT-NeoX: neox_block_nograd)."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r, width = spec.hidden, dt.act, dt.resid, spec.intermediate

    def linear(name: str, nbytes: int, fan_in: int) -> int:
        return peft(name, prog.alloc("activations", nbytes), nbytes, fan_in)

    if ctx.w.task == "train":
        return _gpt2_first_pass(prog, ctx, x, keep_input, linear)
    ln = prog.alloc("activations", T * h * r)
    qkv = linear("c_attn", T * 3 * h * e, h)
    kept = [prog.alloc("kv_cache", T * h * e), prog.alloc("kv_cache", T * h * e)] if cache_kv else []
    attn = prog.alloc("activations", T * h * e)
    prog.transient("activations", T * spec.heads * 4)  # log-sum-exp
    merged = prog.alloc("activations", T * h * e)  # heads merged back, contiguous
    prog.free(attn)
    prog.free(qkv)
    prog.free(ln)
    o = linear("c_proj", T * h * e, h)
    prog.free(merged)
    x2 = prog.alloc("activations", T * h * r)
    prog.free(o)
    ln = prog.alloc("activations", T * h * r)
    fc = linear("c_fc", T * width * e, h)
    prog.free(ln)
    act = _gelu_new(prog, T * width * e, fc)
    down = linear("c_proj", T * h * e, width)
    prog.free(act)
    x3 = prog.alloc("activations", T * h * r)
    prog.free(down)
    prog.free(x2)
    if not keep_input:
        prog.free(x)
    return x3, kept


def _gpt2_first_pass(
    prog: Program, ctx: Ctx, x: int, keep_input: bool, linear: Callable[[str, int, int], int]
) -> tuple[int, list[int]]:
    """GPT-2's block in a checkpointed layer's first pass (training, nothing saved), as the recorded history
    h38_lora_gpt2m_ckpt_b16 shows it: the model in train mode runs each c_proj's output through dropout (its
    one-byte mask made and dropped, the output a new tensor); the packed q/k/v output and ln_1's output live until
    the attention's residual add, the attention's dropout output until the block returns."""
    spec, dt, T = ctx.spec, ctx.dt, ctx.tokens
    h, e, r, width = spec.hidden, dt.act, dt.resid, spec.intermediate

    def dropout(src: int) -> int:
        mask = prog.alloc("activations", T * h)
        out = prog.alloc("activations", T * h * e)
        prog.free(mask)
        prog.free(src)
        return out

    ln = prog.alloc("activations", T * h * r)
    qkv = linear("c_attn", T * 3 * h * e, h)
    attn = prog.alloc("activations", T * h * e)
    prog.transient("activations", T * spec.heads * 4)  # log-sum-exp
    o = linear("c_proj", T * h * e, h)
    prog.free(attn)
    o = dropout(o)
    prog.free(qkv)
    x2 = prog.alloc("activations", T * h * r)
    prog.free(ln)
    ln = prog.alloc("activations", T * h * r)
    fc = linear("c_fc", T * width * e, h)
    act = _gelu_new(prog, T * width * e, fc)
    down = linear("c_proj", T * h * e, width)
    prog.free(act)
    down = dropout(down)
    x3 = prog.alloc("activations", T * h * r)
    prog.free_all([ln, x2, o, down])
    if not keep_input:
        prog.free(x)
    return x3, []
