"""QLoRA after peft's `prepare_model_for_kbit_training` (--kbit-prep), under the HF Trainer's autocast, in the order
the recorded H200 histories kbit_prep_1 … kbit_prep_4 show it (llama-3.1-8b with and without checkpointing,
qwen2.5-3b with; bitsandbytes 0.50.2, torch 2.11, transformers 5.17, peft 0.21).

prepare_model_for_kbit_training casts every parameter that is not 4-bit (embeddings, norms, lm_head, biases) to
fp32, so the job's dtypes change around the 4-bit linears (peft/utils/other.py; bitsandbytes nn/modules.py
Linear4bit.forward):

- the embedding output, the residual stream and the RMSNorms run in fp32 (each norm keeps the residual itself,
  `x.to(fp32)` being a no-op, and its rsqrt);
- a 4-bit linear casts its fp32 input to the compute dtype (a temporary), dequantizes and multiplies in bf16, and
  casts its output back to the input's dtype: q, k, v, gate, up and down come out fp32, o_proj (fed by attention's
  bf16 output) stays bf16;
- peft's fp32 adapters see fp32 inputs (no cast of theirs) and autocast casts each input and weight to bf16 for the
  two skinny matmuls (kept for backward); their update is added to the fp32 base output in fp32;
- RoPE runs on the fp32 q and k (cos and sin stay fp32), SDPA casts q, k and v to bf16 (kept by the kernel), and
  the MLP's activation and product are fp32;
- lm_head's fp32 weight is cast to bf16 for the logits (not cached: the weight is frozen), its copy kept for the
  input's gradient.

In backward every autocast cast has its cast-back: each adapted linear's output gradient is cast to bf16 for the
adapter and again for the 4-bit base, its input gradients come back to fp32 and are added into one buffer.
"""

from __future__ import annotations

from gpuready.memory.lm import nf4
from gpuready.memory.lm.autograd import Layer, Saved
from gpuready.memory.lm.context import Ctx
from gpuready.memory.lm.lora_recorded import LoraBackward
from gpuready.memory.lm.ops import flash_backward_workspace_bytes, lora_update, rope
from gpuready.memory.program import Program


def norm_forward(prog: Program, tokens: int, width: int, grad: bool = True) -> tuple[int, int]:
    """LlamaRMSNorm on an fp32 input with its fp32 weight (frozen): pow, the mean (then pow goes), + eps, rsqrt
    (returned: kept by x * rsqrt when the input needs a gradient, else gone once x * rsqrt is made), x * rsqrt,
    weight * y (the output, returned), then x * rsqrt and the mean go. The input itself is what pow keeps."""
    n = tokens * width * 4
    pw = prog.alloc("activations", n)
    mean = prog.alloc("activations", tokens * 4)
    prog.free(pw)
    t = prog.alloc("activations", tokens * 4)  # + eps
    rs = prog.alloc("activations", tokens * 4)
    prog.free(t)
    y = prog.alloc("activations", n)
    if not grad:
        prog.free(rs)
        rs = 0
    out = prog.alloc("activations", n)
    prog.free(y)
    prog.free(mean)
    return rs, out


def base_output(prog: Program, tokens: int, width_in: int, out: int, fp32_in: bool) -> int:
    """A 4-bit linear's output: its fp32 input cast to bf16 (a temporary), the weight dequantized around the bf16
    matmul (nf4.py), the output cast back to fp32; with a bf16 input (o_proj's), the bf16 output as it is."""
    cast = prog.alloc("activations", tokens * width_in * 2) if fp32_in else 0
    o16 = nf4.forward_output(prog, width_in * out, 2, tokens * out * 2)
    if not fp32_in:
        return o16
    o32 = prog.alloc("activations", tokens * out * 4)
    prog.free(o16)
    prog.free(cast)
    return o32


def norm_backward(
    prog: Program, tokens: int, width: int, g: int, x: int, rs: int, into: bool, also: list[int] | None = None
) -> int:
    """Its backward from the output's gradient `g` (freed): grad * weight, grad * x (for rsqrt's gradient) and grad *
    rsqrt (the input's gradient so far), the row-sized gradients, the mean's gradient expanded, pow's backward; `x`
    and `rs` freed on the way. With `into` the two parts of the input's gradient are added into the residual
    stream's gradient as they come (0 is returned); else the first part becomes that gradient (returned)."""
    n = tokens * width * 4
    alloc, free = prog.alloc, prog.free
    scaled = alloc("activations", n)
    free(g)
    by_x = alloc("activations", n)
    part = alloc("activations", n)
    g_rs = alloc("activations", tokens * 4)
    free(by_x)
    free(scaled)
    if into:
        free(part)
    small = [alloc("activations", tokens * 4) for _ in range(3)]
    free(small[1])
    free(small[0])
    free(g_rs)
    free(rs)
    expanded = alloc("activations", n)
    free(small[2])
    t1, t2, pow_part = alloc("activations", n), alloc("activations", n), alloc("activations", n)
    free(t2)
    free(t1)
    free(expanded)
    free(x)
    prog.free_all(also or [])
    free(pow_part)
    return 0 if into else part


def block_forward(
    prog: Program, ctx: Ctx, x: int, named: dict[str, int], input_grad: bool = True, stop_early: bool = False
) -> tuple[list[Saved], int]:
    """One decoder layer's forward under autograd from the fp32 residual `x` (kept by the input norm, and named
    "in.x32", when the layer's input needs a gradient); returns what it keeps and its output, the next residual.
    `named` gets the handles the backward reads. `stop_early`: a checkpointed layer's recompute, which stops once
    down_proj's lora_B has what it keeps (its output is not made: 0 is returned); the frames unwind, down_proj's
    base output, the MLP product and the norm's output going (kbit_prep_1)."""
    spec, T = ctx.spec, ctx.tokens
    h, a, kv, d, width, rank = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate, ctx.w.lora_r
    q_w, kv_w = a * d, kv * d
    layer_ = Layer(prog, True)
    alloc, save, keep, free = layer_.alloc, layer_.save, layer_.keep_handle, prog.free

    def last() -> int:
        return layer_.saved[-1].handle

    def norm(src: int, key: str, grad: bool) -> int:
        rs, out = norm_forward(prog, T, h, grad)
        if grad:
            keep(rs)
            named[key + ".rs"], named[key + ".x32"] = rs, src
        return out

    def project(name: str, width_in: int, out: int, fp32_in: bool = True, stop: bool = False) -> int:
        """An adapted 4-bit linear: the base output, then peft's branch under autocast (its fp32 adapters' bf16
        copies and the input's, kept; the update in bf16), the sum in the base output's dtype. With `stop`, 0 once
        lora_B's weight copy is made."""
        b = base_output(prog, T, width_in, out, fp32_in)
        x32 = 0 if fp32_in else alloc(T * width_in * 4)  # peft's cast of a bf16 input to the adapters' fp32
        save(rank * width_in * 2)  # autocast's bf16 copy of lora_A's weight
        named[name + ".wa"] = last()
        save(T * width_in * 2)  # the input cast to bf16, kept by lora_A
        named[name + ".x32"] = last()
        save(T * rank * 2)  # lora_A's output, kept by lora_B
        named[name + ".a"] = last()
        save(out * rank * 2)  # lora_B's weight copy
        named[name + ".wb"] = last()
        if stop:
            free(b)
            return 0
        total = lora_update(prog, 0, T * out * 2, T * out * (4 if fp32_in else 2), b)
        free(x32)
        return total

    normed = norm(x, "in", input_grad)
    q = project("q_proj", h, q_w)
    k = project("k_proj", h, kv_w)
    v = project("v_proj", h, kv_w)
    q_rot = rope(prog, T, q_w, 4)
    k_rot = rope(prog, T, kv_w, 4)
    free(q)
    free(k)
    # SDPA under autocast: k, v and q cast to bf16 (kept by the flash kernel), its output and log-sum-exp
    save(T * kv_w * 2)
    named["k16"] = last()
    save(T * kv_w * 2)
    named["v16"] = last()
    save(T * q_w * 2)
    named["q16"] = last()
    save(T * q_w * 2)
    named["attn"] = last()
    save(T * a * 4)
    named["lse"] = last()
    o = project("o_proj", q_w, h, fp32_in=False)
    free(q_rot)
    free(k_rot)
    free(v)
    free(normed)
    resid = alloc(T * h * 4)  # residual + attention, in fp32; kept by the MLP's norm
    keep(resid)
    free(o)
    normed = norm(resid, "post", True)
    gate = project("gate_proj", h, width)
    keep(gate)  # kept by silu
    named["gate"] = gate
    act = alloc(T * width * 4)
    keep(act)  # kept by the product
    named["act"] = act
    up = project("up_proj", h, width)
    keep(up)
    named["up"] = up
    prod = alloc(T * width * 4)
    down = project("down_proj", width, h, stop=stop_early)
    free(prod)
    free(normed)
    if stop_early:
        return layer_.finish(), 0
    out = alloc(T * h * 4)
    free(down)
    return layer_.finish(), out


def block_first_pass(prog: Program, ctx: Ctx, x: int, cached: list[int]) -> int:
    """A checkpointed layer's first pass (nothing saved; each tensor goes when Python drops it) from the fp32
    residual `x`, which the checkpoint keeps; returns the layer's output. The adapters' bf16 weight copies stay in
    autocast's cache until the forward's autocast region ends (appended to `cached`). As kbit_prep_1 records it."""
    spec, T = ctx.spec, ctx.tokens
    h, a, kv, d, width, rank = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate, ctx.w.lora_r
    q_w, kv_w = a * d, kv * d
    free = prog.free

    def alloc(nbytes: int) -> int:
        return prog.alloc("activations", nbytes)

    def project(width_in: int, out: int, fp32_in: bool = True) -> int:
        b = base_output(prog, T, width_in, out, fp32_in)
        x32 = 0 if fp32_in else alloc(T * width_in * 4)
        cached.append(alloc(rank * width_in * 2))
        x16 = alloc(T * width_in * 2)
        la = alloc(T * rank * 2)
        free(x16)
        cached.append(alloc(out * rank * 2))
        total = lora_update(prog, la, T * out * 2, T * out * (4 if fp32_in else 2), b)
        free(x32)
        return total

    normed = norm_forward(prog, T, h, grad=False)[1]
    q = project(h, q_w)
    k = project(h, kv_w)
    v = project(h, kv_w)
    q_rot = rope(prog, T, q_w, 4)
    k_rot = rope(prog, T, kv_w, 4)
    free(q)
    free(k)
    casts = [alloc(T * kv_w * 2), alloc(T * kv_w * 2), alloc(T * q_w * 2)]  # SDPA's k, v and q in bf16
    attn = alloc(T * q_w * 2)
    free(alloc(T * a * 4))  # log-sum-exp
    prog.free_all(casts[::-1])
    o = project(q_w, h, fp32_in=False)
    prog.free_all([attn, q_rot, k_rot, v, normed])
    resid = alloc(T * h * 4)
    free(o)
    normed = norm_forward(prog, T, h, grad=False)[1]
    gate = project(h, width)
    act = alloc(T * width * 4)
    free(gate)
    up = project(h, width)
    prod = alloc(T * width * 4)
    free(act)
    free(up)
    down = project(width, h)
    prog.free_all([prod, normed])
    out = alloc(T * h * 4)
    free(down)
    free(resid)
    return out


class PrepBackward(LoraBackward):
    """The layer's backward (block_forward's `named`), in the recorded order. Under checkpointing (`ckpt`) the
    tensors the recompute saved go before the node's other inputs (kbit_prep_1), otherwise after."""

    def __init__(
        self, prog: Program, ctx: Ctx, kept: dict[str, int], grads: list[int], accumulate: bool, ckpt: bool = False
    ) -> None:
        super().__init__(prog, ctx, kept, grads, accumulate)
        self.ckpt = ckpt

    def _frees(self, saved: list[int], other: list[int]) -> None:
        self.prog.free_all(saved + other if self.ckpt else other + saved[::-1])

    def head16(self, name: str) -> int:
        """The fp32 output gradient cast to bf16 for the adapter's branch, and the branch's scaled gradient."""
        out = self.widths[name][1] * self.T * 2
        g16 = self.prog.alloc("activations", out)
        scaled = self.prog.alloc("activations", out)
        self.prog.free(g16)
        return scaled

    def tail32(self, name: str, g: int, free_g: bool, scaled: int, buf: int, input_grad: bool = True) -> int:
        """lora_B's and lora_A's backward on their bf16 copies, each weight gradient cast to the adapter's fp32, the
        input's gradient back to fp32; the base's input gradient from the output gradient cast to bf16, back to fp32.
        The first input gradient becomes the buffer, the others are added into it."""
        prog, T, r, kept = self.prog, self.T, self.ctx.w.lora_r, self.kept
        width, out = self.widths[name]
        wg = prog.alloc("activations", out * r * 2)
        gb = prog.alloc("activations", T * r * 2)
        self._frees([kept[name + ".a"], kept[name + ".wb"]], [scaled])
        self._weight_grad(out * r * 4)
        prog.free(wg)
        wg = prog.alloc("activations", r * width * 2)
        if not input_grad:
            self._frees([kept[name + ".x32"], kept[name + ".wa"]], [gb])
            self._weight_grad(r * width * 4)
            prog.free(wg)
            if free_g:
                prog.free(g)
            return buf
        gx16 = prog.alloc("activations", T * width * 2)
        self._frees([kept[name + ".x32"], kept[name + ".wa"]], [gb])
        gx = prog.alloc("activations", T * width * 4)
        prog.free(gx16)
        if buf:
            prog.free(gx)  # added into the buffer
        self._weight_grad(r * width * 4)
        prog.free(wg)
        g16 = prog.alloc("activations", T * out * 2)  # the base's output gradient in bf16
        if free_g:
            prog.free(g)
        gbase = nf4.input_grad(prog, width * out, 2, T * width * 2)
        prog.free(g16)
        g32 = prog.alloc("activations", T * width * 4)
        prog.free(gbase)
        prog.free(g32)  # added into the buffer
        return buf or gx

    def linear32(self, name: str, g: int, free_g: bool, buf: int, input_grad: bool = True) -> int:
        return self.tail32(name, g, free_g, self.head16(name), buf, input_grad)

    def run32(
        self,
        resid_grad: int,
        input_grad: bool,
        head: int = 0,
        tables: list[int] | None = None,
        hold_input: bool = False,
    ) -> None:
        """The layer's backward from the residual stream's fp32 gradient (added into in place). `head`: down_proj's
        scaled gradient when it was made before the recompute; `tables`: the rotary cos and sin, freed by the first
        layer (after q's RoPE backward, or with a checkpointed input); `hold_input`: the first layer's input is the
        embedding output that the step holds (it requires grad under checkpointing), not freed here."""
        prog, kept, T, spec = self.prog, self.kept, self.T, self.ctx.spec
        h, q_w, kv_w = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        width = spec.intermediate
        scaled = head or self.head16("down_proj")
        g_prod = self.tail32("down_proj", resid_grad, False, scaled, 0)
        g_up = prog.alloc("activations", T * width * 4)
        g_act = prog.alloc("activations", T * width * 4)
        self._frees([kept["act"], kept["up"]], [g_prod])
        g_norm = self.linear32("up_proj", g_up, True, 0)
        g_gate = prog.alloc("activations", T * width * 4)  # silu's backward
        self._frees([kept["gate"]], [g_act])
        g_norm = self.linear32("gate_proj", g_gate, True, g_norm)
        norm_backward(prog, T, h, g_norm, kept["post.x32"], kept["post.rs"], into=True)
        # o_proj's output is bf16: the residual's gradient cast for it, then the adapter as under autocast
        g_o = prog.alloc("activations", T * h * 2)
        if not input_grad:  # the first layer: the residual's gradient has no other use (the embedding needs none)
            prog.free(resid_grad)
        scaled = prog.alloc("activations", T * h * 2)  # the branch's gradient; the base's is g_o itself
        self.pending[g_o] = True  # it goes after the base's input gradient
        g_attn = self._tail_autocast("o_proj", g_o, scaled, 0, True)
        dq = prog.alloc("activations", T * q_w * 2)
        dk = prog.alloc("activations", T * kv_w * 2)
        dv = prog.alloc("activations", T * kv_w * 2)
        prog.transient("activations", flash_backward_workspace_bytes(spec, T))
        prog.free(g_attn)
        prog.free_all([kept["v16"], kept["q16"], kept["k16"], kept["lse"], kept["attn"]])
        grads32 = []
        for g16, w in ((dq, q_w), (dk, kv_w), (dv, kv_w)):  # SDPA's casts' backward: back to fp32
            grads32.append(prog.alloc("activations", T * w * 4))
            prog.free(g16)
        dq32, dk32, dv32 = grads32
        g_k = self.rope(dk32, kv_w, 4)  # on the fp32 q and k
        g_q = self.rope(dq32, q_w, 4)
        if not self.ckpt:
            prog.free_all(tables or [])
        g_norm = self.linear32("v_proj", dv32, True, 0, input_grad)
        g_norm = self.linear32("k_proj", self.view_copy32(g_k, kv_w), True, g_norm, input_grad)
        g_norm = self.linear32("q_proj", self.view_copy32(g_q, q_w), True, g_norm, input_grad)
        if input_grad:
            x = 0 if hold_input else kept["in.x32"]
            also = (tables or []) if self.ckpt else []
            norm_backward(prog, T, h, g_norm, x, kept["in.rs"], into=True, also=also)

    def view_copy32(self, g: int, width: int) -> int:
        out = self.prog.alloc("activations", self.T * width * 4)
        self.prog.free(g)
        return out


def final_norm(prog: Program, ctx: Ctx, x: int) -> tuple[list[int], int]:
    """The final norm on the fp32 residual: its kept handles (the residual and rsqrt) and its output (lm_head's
    input, held until the loss is computed)."""
    rs, out = norm_forward(prog, ctx.tokens, ctx.spec.hidden)
    return [x, rs], out


def final_norm_backward(prog: Program, ctx: Ctx, dx: int, kept: list[int]) -> int:
    """From lm_head's fp32 input gradient: the residual stream's gradient (the first part of the norm's input
    gradient), the residual and rsqrt freed."""
    return norm_backward(prog, ctx.tokens, ctx.spec.hidden, dx, kept[0], kept[1], into=False)
