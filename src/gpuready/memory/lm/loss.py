"""The model's head: the final norm, logits and the Hugging Face loss (loss_utils.ForCausalLMLoss upcasts the
logits to fp32), and generate()'s sampling.
"""

from __future__ import annotations

from gpuready.memory.lm import sampling
from gpuready.memory.lm.context import Ctx
from gpuready.memory.lm.ops import norm_backward_frozen, reduce_buffer_bytes
from gpuready.memory.program import Program


def final_norm_forward(prog: Program, ctx: Ctx, x: int) -> tuple[list[int], int, int]:
    """The model's last RMSNorm under autograd, in the recorded order (ft_qwen3_06b_b8): x.to(fp32) (kept),
    pow (a temporary), mean, + eps, rsqrt (kept), x * rsqrt (freed once cast), .to(dtype) (kept by the weight's
    product when the weight trains), weight * y: the output, lm_head's input. The freed temporaries leave the blocks
    that backward's cuBLAS workspace later takes. In 16 bits the last residual goes here (the norm saved its fp32
    copy); in fp32 the norm saves the residual itself. Under LoRA (frozen norm weight and lm_head) nothing keeps the
    cast or the output: the cast goes once weight * y is made, and the output is held only by the model's returned
    `last_hidden_state` until the loss has been computed (the recorded H200 history
    qwen3_8b_lora_ckpt_s2048_b5_cap40: the 80 MiB cast freed at once, the output after the loss's fp32 logits).
    Returns the kept handles, the residual's handle if still held (0 if freed) and the frozen output's handle (0
    when lm_head keeps it among the kept ones)."""
    T, h, e, r = ctx.tokens, ctx.spec.hidden, ctx.dt.act, ctx.dt.resid
    kept = [prog.alloc("activations", T * h * 4)] if r == 2 else []
    prog.free(prog.alloc("activations", T * h * 4))  # pow(2)
    kept.append(prog.alloc("activations", T * 4))  # mean, then rsqrt: kept
    scaled = prog.alloc("activations", T * h * 4)
    frozen = not ctx.full and r == 2
    if frozen:
        cast = prog.alloc("activations", T * h * r)
        out = prog.alloc("activations", T * h * e)
        prog.free(cast)
        prog.free(scaled)
        prog.free(x)
        return kept, 0, out
    if r == 2:
        kept.append(prog.alloc("activations", T * h * r))
    kept.append(prog.alloc("activations", T * h * e))
    prog.free(scaled)
    if r == 2:
        prog.free(x)
        x = 0
    return kept, x, 0


def final_norm_backward_frozen(prog: Program, ctx: Ctx, dx: int, kept: list[int]) -> int:
    """The backward of the final RMSNorm with a frozen weight (LoRA) from lm_head's input gradient `dx`
    (ops.norm_backward_frozen; `kept`: the fp32 input and rsqrt, which it frees): the residual stream's gradient."""
    return norm_backward_frozen(prog, ctx.tokens, ctx.spec.hidden, ctx.tokens, ctx.dt.act, dx, kept[0], kept[1])


def final_norm_backward_trainable(prog: Program, ctx: Ctx, dx: int, kept: list[int]) -> tuple[int, int]:
    """The backward of the final RMSNorm whose weight trains, in 16 bits without autocast (full fine-tuning), from
    lm_head's input gradient `dx`, as the recorded history h41_adamw8bit_smollm2_b10 makes it (the events between
    lm_head's backward and the last layer's): lm_head's input (the norm's output) goes; weight * y's backward makes
    the gradient times the weight and times y, the weight's gradient and its reduction buffer; y (the 16-bit cast)
    and `dx` go; .to(dtype)'s backward casts to fp32; x * rsqrt's backward (the fp32 input's gradient so far, and
    rsqrt's through row sums); mean's and pow's backward (four input-sized fp32 tensors, the fp32 input freed among
    them); .to(fp32)'s backward: the residual stream's 16-bit gradient. `kept`: final_norm_forward's (the fp32
    input, rsqrt, y, the output), all freed. Returns the residual stream's gradient and the weight's gradient."""
    T, h, e = ctx.tokens, ctx.spec.hidden, ctx.dt.act
    n32, rows = T * h * 4, T * 4
    alloc, free = prog.alloc, prog.free
    x32, rs, y, out = kept
    free(out)
    by_weight, by_y = alloc("activations", T * h * e), alloc("activations", T * h * e)
    weight_grad = alloc("gradients", h * ctx.dt.param)
    reduce = alloc("activations", reduce_buffer_bytes(h, T))
    prog.transient("activations", 64)  # (a 64-byte request the reduction makes and frees)
    free(reduce)
    free(by_y)
    free(dx)
    free(y)
    g32 = alloc("activations", n32)
    free(by_weight)
    by_x, g_in = alloc("activations", n32), alloc("activations", n32)
    r1 = alloc("activations", rows)
    free(by_x)
    free(g32)
    r2, r3, r4 = alloc("activations", rows), alloc("activations", rows), alloc("activations", rows)
    prog.free_all([r3, r2, r1, rs])
    expanded = alloc("activations", n32)
    free(r4)
    p1, p2, p3 = alloc("activations", n32), alloc("activations", n32), alloc("activations", n32)
    prog.free_all([p2, p1, expanded, x32, p3])
    resid = alloc("activations", T * h * e)
    free(g_in)
    return resid, weight_grad


def logits_and_loss_forward(prog: Program, ctx: Ctx, held: int = 0, cast_input: bool = False) -> list[int]:
    """lm_head output -> .float() -> log_softmax (kept) ; returns handles kept for backward. `held`: the final
    norm's output when nothing keeps it for backward (frozen lm_head), freed once the loss is computed, before the
    logits (the recorded history qwen3_8b_lora_ckpt_s2048_b5_cap40). `cast_input`: autocast casts lm_head's fp32
    input to bf16 around the matmul (--kbit-prep, lm/kbit_prep.py)."""
    T, V, e = ctx.tokens, ctx.spec.vocab, ctx.dt.act
    cast = prog.alloc("activations", T * ctx.spec.hidden * 2) if cast_input else 0
    logits = prog.alloc("logits_and_loss", T * V * e)
    prog.free(cast)
    kept: list[int] = []
    if ctx.spec.logit_softcap:
        # gemma2: logits / cap (the logits go), tanh (kept), * cap, as the recorded history of gemma-2-2b shows
        t = prog.alloc("logits_and_loss", T * V * e)
        prog.free(logits)
        kept.append(prog.alloc("logits_and_loss", T * V * e))
        prog.free(t)
        logits = prog.alloc("logits_and_loss", T * V * e)
    up = prog.alloc("logits_and_loss", T * V * 4) if e != 4 else None
    kept.append(prog.alloc("logits_and_loss", T * V * 4))  # log_softmax output
    if up is not None:
        prog.free(up)
    prog.free(held)
    prog.free(logits)  # the model output (and its bf16 logits) is dropped once .loss is taken
    return kept


def logits_and_loss_backward(prog: Program, ctx: Ctx, kept: list[int]) -> int:
    T, V, e = ctx.tokens, ctx.spec.vocab, ctx.dt.act
    g1 = prog.alloc("logits_and_loss", T * V * 4)  # nll_loss backward
    g2 = prog.alloc("logits_and_loss", T * V * 4)  # log_softmax backward
    prog.free(kept.pop())
    prog.free(g1)
    g3 = prog.alloc("logits_and_loss", T * V * e) if e != 4 else g2
    if g3 != g2:
        prog.free(g2)
    for h in reversed(kept):  # softcap: the gradient through * cap, tanh (its kept output goes) and / cap
        for step in range(3):
            g4 = prog.alloc("logits_and_loss", T * V * e)
            prog.free(g3)
            if step == 1:
                prog.free(h)
            g3 = g4
    return g3


def softcap_nograd(prog: Program, logits: int, nbytes: int) -> int:
    """Gemma 2's final logit soft-capping without autograd (modeling_gemma2.py: logits / cap, tanh, * cap), each
    a new tensor that replaces the one before, so two logits tensors are live at once (the recorded history
    h37_prefill_gemma2_27b_b2: 2000 MiB each at 2 x 2048 tokens). Returns the capped logits."""
    for _ in range(3):
        new = prog.alloc("logits_and_loss", nbytes)
        prog.free(logits)
        logits = new
    return logits


class Sampler:
    """generate()'s greedy sampling after each forward, as the recorded history of gen_llama1b_fp16 shows it
    (transformers generation/utils.py `_sample` and logits_process.py): lm_head's output for the last position;
    its fp32 copy `next_token_logits` (kept until the next step's copy replaces it); the two minimum-length
    processors the probe's `min_new_tokens` adds, each a `scores.clone()`-sized fp32 tensor, a torch.where
    result and an int64 vocabulary index, the last result kept until the next step's processors are done.

    With `row_bytes` (B x 8: generate()'s int64 [B, L] bookkeeping), each step also grows the two model_kwargs
    tensors `_update_model_kwargs_for_generation` concatenates (the first's old copy going at once, the second's
    once lm_head's output has gone) and input_ids (`torch.cat([input_ids, next_tokens])`), and the next forward's
    mask check makes one more for a moment (`masking_utils.fast_all`); `positions` (prepare_inputs' [B, S] position
    ids of the prefill) go once lm_head has run. Past 1 MiB these are large-pool blocks, placed in the free tails of
    the KV cache's segments (h57_gen_qwen3_06b_b128: 1.01 MiB each at 128 x 1034).

    With `sample` (--decoding sample), the processors' result (else the copy) goes through the sampling warpers, and
    softmax's probabilities are kept until the next step's (lm/sampling.py)."""

    def __init__(
        self,
        prog: Program,
        batch: int,
        vocab: int,
        act: int,
        softcap: bool = False,
        processors: bool = True,
        row_bytes: int = 0,
        positions: int = 0,
        sample: bool = False,
    ) -> None:
        self.prog, self.B, self.V, self.e = prog, batch, vocab, act
        self.softcap = softcap
        self.processors = processors  # the minimum-length processors: only with an end-of-sequence token
        self.row_bytes = row_bytes
        self.positions = positions
        self.logits_copy = 0
        self.scores = 0
        self.kwargs = [0, 0]
        self.ids = 0
        self.sample = sample  # --decoding sample: the warpers, softmax and multinomial (lm/sampling.py)
        self.probs = 0

    def step(self, tokens: int = 0) -> None:
        """One step's sampling; `tokens`: the sequence length once this step's token is appended."""
        prog, B, V = self.prog, self.B, self.V
        out = prog.alloc("logits_and_loss", B * V * self.e)
        if self.softcap:
            out = softcap_nograd(prog, out, B * V * self.e)
        rows = self.row_bytes * tokens
        grown = [0, 0]
        if rows:
            prog.free(self.positions)
            self.positions = 0
            grown = [prog.alloc("activations", rows), prog.alloc("activations", rows)]
            prog.free(self.kwargs[0])
        copy = prog.alloc("logits_and_loss", B * V * 4)
        prog.free(self.logits_copy)
        self.logits_copy = copy
        result = 0
        for _ in range(2 if self.processors else 0):
            t = prog.alloc("logits_and_loss", B * V * 4)
            index = prog.alloc("logits_and_loss", V * 8)
            new = prog.alloc("logits_and_loss", B * V * 4)
            prog.free(t)
            prog.free(index)
            prog.free(result)
            result = new
        if self.sample:
            result = sampling.warp(prog, B, V, result or copy, owned=bool(result))
        prog.free(self.scores)
        self.scores = result
        if self.sample:
            self.probs = sampling.draw(prog, B, V, self.probs)
        if rows:
            ids = prog.alloc("activations", rows)
            prog.free(self.ids)
            self.ids = ids
        prog.free(out)
        if rows:
            prog.free(self.kwargs[1])
            self.kwargs = grown
            prog.transient("activations", rows)

    def finish(self) -> None:
        self.prog.free(self.logits_copy)
        self.prog.free(self.scores)
        self.prog.free(self.probs)
        self.prog.free_all(self.kwargs)
        self.prog.free(self.ids)
