"""A LoRA layer's backward (and, under checkpointing, its recompute's early stop) in the order recorded H200
allocator histories show it: docs/calibration/histories/qwen3_8b_lora_ckpt_s2048_b5_cap40.json.gz (qwen3-8b, peft
LoRA r16 on every linear, non-reentrant checkpointing, 5 x 2048 tokens) and lora_qwen3b_s1024_b2_cap24.json.gz
(qwen2.5-3b, no checkpointing, 2 x 1024; torch 2.11, transformers 5.17, peft 0.21). QLoRA's layers run the same
way with the 4-bit weight dequantized for each matmul (nf4.py: qlora_llama8b_b1_s2048, qlora_qwen3_4b_ckpt_b8_s2048).

What the records show, and the code it follows:

- peft's lora.Linear.forward (peft tuners/lora/layer.py) computes `result = base_layer(x)`, casts x to the
  adapter's fp32 (`_cast_input_dtype`), adds `lora_B(lora_A(x)) * scaling` in fp32 and casts the sum back. Its
  backward, per adapted linear: the cast back's gradient in fp32; the base output's gradient (the sum's gradient
  cast to the base dtype) and the scaled branch's (times the scaling, fp32); lora_B's weight gradient, then its
  input's (freeing lora_A's saved output and the scaled gradient); lora_A's weight gradient, then its input's in
  fp32 (freeing the saved fp32 x); that cast back to the activation dtype; then the frozen base's input gradient.
- Where two paths meet (the norm output read by q, k and v, or by gate and up; the residual stream), autograd's
  InputBuffer adds the later gradient into the first in place and frees it (torch/csrc/autograd/input_buffer.cpp):
  one gradient buffer per meeting point, and the residual stream's gradient is one tensor for the whole backward.
- RMSNorm with a frozen weight (ops.norm_backward_frozen), RoPE's backward, flash attention's backward with its
  scratch (ops.flash_backward_workspace_bytes), and the copy q's and k's gradients take at the projections' view.
- Non-reentrant checkpointing (torch/utils/checkpoint.py, early stop on by default) recomputes a layer only until
  the last tensor its backward needs is made (down_proj's lora_A output), then unwinds: down_proj's base output, the
  MLP product, the norm's output and the mid-layer residual go. The backward nodes that need no saved tensor run
  before the recompute starts: the layer output's gradient through down_proj's cast and sum (LoraBackward.head).
- Without checkpointing the embedding output needs no gradient, so neither does the first layer's input: its q, k
  and v make their adapters' weight gradients only, and its input norm keeps nothing and has no backward.
"""

from __future__ import annotations

from gpuready.memory.lm import nf4
from gpuready.memory.lm.blocks_recorded import recorded_layer_order
from gpuready.memory.lm.context import GEMMA_NORMS, Ctx, layer_lora
from gpuready.memory.lm.ops import flash_backward_workspace_bytes, norm_backward_frozen, rope_backward
from gpuready.memory.program import Program

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# with 16-bit adapters, the adapter that reads a shared input last in backward frees it (v, k, q; up, gate; down)
LAST_READER = {"q_proj": "in.out", "gate_proj": "post.out", "down_proj": "prod"}


def lora_recorded(ctx: Ctx, layer: int) -> bool:
    """Whether this layer's backward follows the recorded LoRA order: a plain decoder layer (separate q, k, v and
    gate, up projections, two RMSNorms) under 16-bit LoRA on all seven linears, flash attention, on one GPU."""
    spec = ctx.spec
    lins = {lin.name for lin in spec.block_linears}
    return (
        recorded_layer_order(ctx, layer)
        and ctx.w.method in ("lora", "qlora")
        and not ctx.full
        and ctx.dt.act == 2
        and ctx.dt.resid == 2
        and not ctx.dt.autocast
        and ctx.backend == "flash"
        and ctx.shards == 1
        and spec.norm == "rms"
        and spec.norms_per_layer == 2
        and spec.model_type not in GEMMA_NORMS
        and spec.model_type != "gpt2"
        and spec.gated_mlp
        and not spec.mla
        and not spec.experts
        and not spec.shared_intermediate
        and set(LINEARS) <= lins
        and set(LINEARS) <= layer_lora(ctx, layer)
    )


class LoraBackward:
    """One layer's backward; `kept` holds the forward's saved handles by name (blocks_recorded.plain_block_forward's
    `named`), `grads` collects the adapters' weight gradients (freed at once when `accumulate`: added into .grad)."""

    def __init__(self, prog: Program, ctx: Ctx, kept: dict[str, int], grads: list[int], accumulate: bool) -> None:
        self.prog, self.ctx, self.kept, self.grads, self.accumulate = prog, ctx, kept, grads, accumulate
        self.T, self.e = ctx.tokens, ctx.dt.act
        self.widths = {lin.name: (lin.in_features, lin.out_features) for lin in ctx.spec.block_linears}
        self.quantized = ctx.w.method == "qlora"
        self.autocast = ctx.dt.autocast16
        self.lora16 = ctx.dt.lora16
        self.pending: dict[int, bool] = {}  # under autocast: base-output gradients (the incoming one) to free

    def _weight_grad(self, nbytes: int) -> None:
        handle = self.prog.alloc("gradients", nbytes)
        if self.accumulate:
            self.prog.free(handle)
        else:
            self.grads.append(handle)

    def head(self, name: str, g: int, free_g: bool, input_grad: bool = True) -> tuple[int, int]:
        """peft's cast back and sum for `name`'s output gradient `g`: returns the base output's gradient (0 when
        the linear's input needs none: then neither does the frozen base's output) and the scaled branch's."""
        prog, T = self.prog, self.T
        out = self.widths[name][1]
        if self.autocast or self.lora16:
            # the sum is the output (no cast back): its gradient reaches the base and the scaled branch as it is
            scaled = prog.alloc("activations", T * out * self.e)
            if not input_grad:
                if free_g:
                    prog.free(g)
                return 0, scaled
            self.pending[g] = free_g
            return g, scaled
        g32 = prog.alloc("activations", T * out * 4)
        if free_g:
            prog.free(g)
        base = prog.alloc("activations", T * out * self.e) if input_grad else 0
        scaled = prog.alloc("activations", T * out * 4)
        prog.free(g32)
        return base, scaled

    def tail(self, name: str, base: int, scaled: int, buf: int, input_grad: bool = True) -> int:
        """lora_B's and lora_A's backward, the input cast's and the frozen base's: the input gradient added into
        `buf` (returned; the first gradient becomes the buffer). Without `input_grad` (the first layer's q, k and v
        when the embedding output needs no gradient) lora_A makes its weight's gradient only."""
        prog, T, e, r = self.prog, self.T, self.e, self.ctx.w.lora_r
        width, out = self.widths[name]
        if self.lora16:
            return self._tail_16(name, base, scaled, buf, input_grad)
        if self.autocast:
            return self._tail_autocast(name, base, scaled, buf, input_grad)
        self._weight_grad(out * r * 4)
        gb = prog.alloc("activations", T * r * 4)
        prog.free(self.kept[name + ".a"])
        prog.free(scaled)
        self._weight_grad(r * width * 4)
        if not input_grad:
            prog.free(gb)
            prog.free(self.kept[name + ".x32"])
            return buf
        gx32 = prog.alloc("activations", T * width * 4)
        prog.free(self.kept[name + ".x32"])
        prog.free(gb)
        gx = prog.alloc("activations", T * width * e)
        prog.free(gx32)
        buf = self._add(buf, gx)
        return self._add(buf, self._base_grad(width, out, base))

    def _tail_16(self, name: str, base: int, scaled: int, buf: int, input_grad: bool) -> int:
        """The same with 16-bit adapters (--lora-dtype bf16; the recorded history trl_qlora_llama8b_b1): lora_B's
        weight gradient and its input's, lora_A's weight gradient and its input's, all in 16 bits; the input lora_A
        kept goes with its last reader; the first input gradient and the base's are summed into a new tensor (the
        buffer), later ones added into it."""
        prog, T, e, r = self.prog, self.T, self.e, self.ctx.w.lora_r
        width, out = self.widths[name]
        self._weight_grad(out * r * e)
        gb = prog.alloc("activations", T * r * e)
        prog.free_all([scaled, self.kept[name + ".a"]])
        self._weight_grad(r * width * e)
        owned = self.kept.get(LAST_READER.get(name, ""), 0)
        if not input_grad:
            prog.free_all([gb, owned])
            return buf
        gx = prog.alloc("activations", T * width * e)
        prog.free_all([gb, owned])
        first = not buf
        if not first:
            prog.free(gx)  # added into the buffer
        gbase = self._base_grad(width, out, base)
        if first:
            total = prog.alloc("activations", T * width * e)
            prog.free_all([gx, gbase])
            return total
        prog.free(gbase)
        return buf

    def _tail_autocast(self, name: str, base: int, scaled: int, buf: int, input_grad: bool) -> int:
        """The same under autocast over 16-bit weights (the recorded history ac_llama1b_lora_b4): lora_B's
        weight gradient in 16 bits, its input's; the saved copies go; the weight gradient cast to the adapter's
        fp32; then lora_A's likewise, its input gradient cast to fp32 (autocast's cast) and back (peft's)."""
        prog, T, e, r = self.prog, self.T, self.e, self.ctx.w.lora_r
        width, out = self.widths[name]
        kept = self.kept
        wg = prog.alloc("activations", out * r * e)
        gb = prog.alloc("activations", T * r * e)
        prog.free_all([scaled, kept[name + ".wb"], kept[name + ".a"]])
        self._weight_grad(out * r * 4)
        prog.free(wg)
        wg = prog.alloc("activations", r * width * e)
        if not input_grad:
            prog.free_all([gb, kept[name + ".wa"], kept[name + ".x32"]])
            self._weight_grad(r * width * 4)
            prog.free(wg)
            return buf
        gx16 = prog.alloc("activations", T * width * e)
        prog.free_all([gb, kept[name + ".wa"], kept[name + ".x32"]])
        gx32 = prog.alloc("activations", T * width * 4)
        prog.free(gx16)
        self._weight_grad(r * width * 4)
        prog.free(wg)
        gx = prog.alloc("activations", T * width * e)
        prog.free(gx32)
        buf = self._add(buf, gx)
        return self._add(buf, self._base_grad(width, out, base))

    def _base_grad(self, width: int, out: int, base: int) -> int:
        """The frozen base's input gradient (the 4-bit weight dequantized around it under QLoRA, nf4.py); then the
        base output's gradient goes (under autocast or with 16-bit adapters it is the incoming gradient itself,
        freed here only when the caller let it go)."""
        T, e = self.T, self.e
        if self.quantized:
            gbase = nf4.input_grad(self.prog, width * out, e, T * width * e)
        else:
            gbase = self.prog.alloc("activations", T * width * e)
        if not (self.autocast or self.lora16) or self.pending.pop(base, False):
            self.prog.free(base)
        return gbase

    def _add(self, buf: int, g: int) -> int:
        if buf:
            self.prog.free(g)  # added in place into the buffer
            return buf
        return g

    def linear(self, name: str, g: int, free_g: bool, buf: int, input_grad: bool = True) -> int:
        base, scaled = self.head(name, g, free_g, input_grad)
        return self.tail(name, base, scaled, buf, input_grad)

    def view_copy(self, g: int, width: int) -> int:
        """q's and k's gradient made contiguous again by the projection's view (it arrives in attention's layout,
        transposed): a copy, and the gradient freed. v's does not need one (flash attention writes dv in v's
        layout)."""
        out = self.prog.alloc("activations", self.T * width * self.e)
        self.prog.free(g)
        return out

    def rope(self, g: int, width: int, act: int = 0) -> int:
        """RoPE's backward (q * cos + rotate_half(q) * sin) from the rotated tensor's gradient `g`, which it frees:
        returns the gradient of its input (`act` bytes an element; the activations' by default)."""
        return rope_backward(self.prog, self.T * width * (act or self.e), g)

    def run(
        self,
        resid_grad: int,
        head: tuple[int, int] | None,
        layer_input: int,
        input_grad: bool = True,
        tables: list[int] | None = None,
    ) -> None:
        """The layer's backward from the residual stream's gradient `resid_grad` (kept: the layer's input gradient
        is added into it); `head`: down_proj's head when it ran before the recompute; `layer_input`: the
        checkpointed layer input, freed once the input norm's backward has freed its fp32 copy (0: none).
        `input_grad` False: the first layer when the embedding output needs no gradient (LoRA without
        checkpointing, the recorded history lora_qwen3b_s1024_b2_cap24): `resid_grad` goes once o_proj's backward
        has read it, q, k and v make only their adapters' gradients and the input norm has no backward. `tables`:
        the rotary cos and sin (the first layer's backward frees them: after q's RoPE backward, whose products kept
        them, or with a checkpointed layer's input, which the checkpoint keeps with them)."""
        prog, kept, T, e, spec = self.prog, self.kept, self.T, self.e, self.ctx.spec
        h, q_w, kv_w = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        width = spec.intermediate
        base, scaled = head if head is not None else self.head("down_proj", resid_grad, False)
        g_prod = self.tail("down_proj", base, scaled, 0)
        # the product act * up: both gradients, then its saved operands and the incoming gradient go
        g_up = prog.alloc("activations", T * width * e)
        g_act = prog.alloc("activations", T * width * e)
        prog.free_all([kept["act"], kept["up"], g_prod])
        g_norm = self.linear("up_proj", g_up, True, 0)
        g_gate = prog.alloc("activations", T * width * e)  # silu's backward
        prog.free_all([kept["gate"], g_act])
        g_norm = self.linear("gate_proj", g_gate, True, g_norm)
        prog.free(norm_backward_frozen(prog, T, h, T, e, g_norm, kept["post.x32"], kept.get("post.rs", 0)))
        g_attn = self.linear("o_proj", resid_grad, not input_grad, 0)
        # flash attention's backward: dq, dk, dv and the kernel's scratch; then what it kept goes
        dq = prog.alloc("activations", T * q_w * e)
        dk = prog.alloc("activations", T * kv_w * e)
        dv = prog.alloc("activations", T * kv_w * e)
        prog.transient("activations", flash_backward_workspace_bytes(spec, T))
        prog.free_all([kept["attn"], kept["lse"], kept["v"], kept["q_rot"], kept["k_rot"], g_attn])
        g_k = self.rope(dk, kv_w)
        g_q = self.rope(dq, q_w)
        if not input_grad:
            prog.free_all(tables or [])
            tables = []
        g_norm = self.linear("v_proj", dv, True, 0, input_grad)
        if spec.qk_norm:
            g_k = norm_backward_frozen(
                prog, T, kv_w, T * spec.kv_heads, e, g_k, kept["k_norm.x32"], kept.get("k_norm.rs", 0)
            )
        g_norm = self.linear("k_proj", self.view_copy(g_k, kv_w), True, g_norm, input_grad)
        if spec.qk_norm:
            g_q = norm_backward_frozen(
                prog, T, q_w, T * spec.heads, e, g_q, kept["q_norm.x32"], kept.get("q_norm.rs", 0)
            )
        g_norm = self.linear("q_proj", self.view_copy(g_q, q_w), True, g_norm, input_grad)
        if not input_grad:
            return
        also = [layer_input, *(tables or [])]  # the checkpoint's saved inputs go once the norm has freed its own
        prog.free(norm_backward_frozen(prog, T, h, T, e, g_norm, kept["in.x32"], kept.get("in.rs", 0), also=also))
