"""The model's head: the final norm, logits and the Hugging Face loss (loss_utils.ForCausalLMLoss upcasts the
logits to fp32), and generate()'s sampling.
"""

from __future__ import annotations

from gpuready.memory.lm.context import Ctx
from gpuready.memory.program import Program


def final_norm_forward(prog: Program, ctx: Ctx, x: int) -> tuple[list[int], int]:
    """The model's last RMSNorm under autograd, in the recorded order (ft_qwen3_06b_b8): x.to(fp32) (kept),
    pow (a temporary), mean, + eps, rsqrt (kept), x * rsqrt (freed once cast), .to(dtype) (kept by the weight's
    product), weight * y: the output, lm_head's input. The freed temporaries leave the blocks that backward's
    cuBLAS workspace later takes. In 16 bits the last residual goes here (the norm saved its fp32 copy); in fp32
    the norm saves the residual itself. Returns the kept handles and the residual's handle if still held (0 if
    freed)."""
    T, h, e, r = ctx.tokens, ctx.spec.hidden, ctx.dt.act, ctx.dt.resid
    kept = [prog.alloc("activations", T * h * 4)] if r == 2 else []
    prog.free(prog.alloc("activations", T * h * 4))  # pow(2)
    kept.append(prog.alloc("activations", T * 4))  # mean, then rsqrt: kept
    scaled = prog.alloc("activations", T * h * 4)
    if r == 2:
        kept.append(prog.alloc("activations", T * h * r))
    kept.append(prog.alloc("activations", T * h * e))
    prog.free(scaled)
    if r == 2:
        prog.free(x)
        x = 0
    return kept, x


def logits_and_loss_forward(prog: Program, ctx: Ctx) -> list[int]:
    """lm_head output -> .float() -> log_softmax (kept) ; returns handles kept for backward."""
    T, V, e = ctx.tokens, ctx.spec.vocab, ctx.dt.act
    logits = prog.alloc("logits_and_loss", T * V * e)
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


class Sampler:
    """generate()'s greedy sampling after each forward, as the recorded history of gen_llama1b_fp16 shows it
    (transformers generation/utils.py `_sample` and logits_process.py): lm_head's output for the last position;
    its fp32 copy `next_token_logits` (kept until the next step's copy replaces it); the two minimum-length
    processors the probe's `min_new_tokens` adds, each a `scores.clone()`-sized fp32 tensor, a torch.where
    result and an int64 vocabulary index, the last result kept until the next step's processors are done."""

    def __init__(self, prog: Program, batch: int, vocab: int, act: int) -> None:
        self.prog, self.B, self.V, self.e = prog, batch, vocab, act
        self.logits_copy = 0
        self.scores = 0

    def step(self) -> None:
        prog, B, V = self.prog, self.B, self.V
        out = prog.alloc("logits_and_loss", B * V * self.e)
        copy = prog.alloc("logits_and_loss", B * V * 4)
        prog.free(self.logits_copy)
        self.logits_copy = copy
        result = 0
        for _ in range(2):
            t = prog.alloc("logits_and_loss", B * V * 4)
            index = prog.alloc("logits_and_loss", V * 8)
            new = prog.alloc("logits_and_loss", B * V * 4)
            prog.free(t)
            prog.free(index)
            prog.free(result)
            result = new
        prog.free(self.scores)
        self.scores = result
        prog.free(out)

    def finish(self) -> None:
        self.prog.free(self.logits_copy)
        self.prog.free(self.scores)
