"""generate()'s sampling warpers (`--decoding sample`), as the recorded H200 histories h58-h61 show them (transformers
5.17 logits_process.py, torch 2.11): temperature, top-k and top-p over the step's fp32 scores, then softmax and
torch.multinomial. The sizes are multiples of N = batch x vocabulary (fp32 scores: 4N bytes); the two scratch
buffers of top-p's torch.sort (cub's radix sort) are measured linear fits, each within 512 bytes on the four
histories (N from 4.10 to 9.72 million).
"""

from __future__ import annotations

from typing import Any

from gpuready.memory.program import Program
from gpuready.memory.template import Batch, PerBatch
from gpuready.workload.spec import SAMPLING

# torch.sort's scratch, bytes = a * N + c: the larger holds the keys' and values' double buffers (12 bytes an element)
# with the radix passes' counters, the smaller the segment pass's (h58-h61: 49,940,991 ... 118,547,967 and
# 731,647 ... 1,732,095 bytes)
SORT_SCRATCH = (12.19045, 9257)
SORT_SCRATCH_SMALL = (0.1778, 3248)
TOPK_SELECT = 393_216  # top-k's radix select scratch: 384 KiB, + 512 bytes a row at most (h58, h59)


class _ScratchAt:
    """A sort scratch's bytes at each batch (a fit's a x batch x vocab + c is not an integer multiple of the batch)."""

    def __init__(self, vocab: int, fit: tuple[float, int]) -> None:
        self.vocab, self.fit = vocab, fit

    def __call__(self, batch: int) -> int:
        a, c = self.fit
        return int(a * batch * self.vocab + c)


def _scratch(batch: Any, vocab: int, fit: tuple[float, int]) -> Any:
    """The scratch's bytes, or with the batch a template symbol its template.PerBatch (it grows with the batch)."""
    at = _ScratchAt(vocab, fit)
    return PerBatch(at) if isinstance(batch, Batch) else at(batch)


def warp(prog: Program, batch: int, vocab: int, scores: int, owned: bool) -> int:
    """The three warpers over `scores` (a handle to 4N bytes; `owned`: an earlier processor's result, freed once the
    temperature's division has made its own). Returns the handle of the warped scores, which generate() keeps as
    next_token_scores until the next step's are made."""
    B, N = batch, batch * vocab
    k = min(int(SAMPLING["top_k"]), vocab)
    # TemperatureLogitsWarper: scores / temperature (logits_process.py:302)
    t = prog.alloc("logits_and_loss", 4 * N)
    if owned:
        prog.free(scores)
    # TopKLogitsWarper: scores < torch.topk(scores, k)[0][..., -1, None], then masked_fill (593-594)
    values = prog.alloc("logits_and_loss", B * k * 4)
    indices = prog.alloc("logits_and_loss", B * k * 8)
    select = [
        prog.alloc("logits_and_loss", n) for n in (B * 4, B * 8, B * 8, TOPK_SELECT + 512 * B, B * 1024, 3328, 3328)
    ]
    for _ in range(2):
        prog.transient("logits_and_loss", 1279)
    for h in reversed(select):
        prog.free(h)
    prog.free(indices)
    mask = prog.alloc("logits_and_loss", N)
    prog.free(values)
    kept = prog.alloc("logits_and_loss", 4 * N)
    prog.free(mask)
    prog.free(t)
    # TopPLogitsWarper (528-538): torch.sort's values and int64 indices, with its scratch (two 8N, a 4N, cub's);
    # softmax then cumsum; two bool masks (<= 1 - top_p, and scattered back); masked_fill
    sorted_values = prog.alloc("logits_and_loss", 4 * N)
    sorted_indices = prog.alloc("logits_and_loss", 8 * N)
    a = prog.alloc("logits_and_loss", 8 * N)
    b = prog.alloc("logits_and_loss", 8 * N)
    c = prog.alloc("logits_and_loss", 4 * N)
    prog.transient("logits_and_loss", _scratch(B, vocab, SORT_SCRATCH))
    prog.free(c)
    prog.transient("logits_and_loss", _scratch(B, vocab, SORT_SCRATCH_SMALL))
    prog.free(b)
    prog.free(a)
    soft = prog.alloc("logits_and_loss", 4 * N)
    cumulative = prog.alloc("logits_and_loss", 4 * N)
    prog.free(soft)
    below = prog.alloc("logits_and_loss", N)
    scattered = prog.alloc("logits_and_loss", N)
    out = prog.alloc("logits_and_loss", 4 * N)
    prog.free_all([sorted_values, sorted_indices, cumulative, below, scattered, kept])
    return out


def draw(prog: Program, batch: int, vocab: int, probs: int) -> int:
    """softmax(next_token_scores) and torch.multinomial(probs, 1): the new probabilities (4N, kept until the next
    step's are made: `probs` is the previous step's, 0 on the first), and multinomial's 4N scratch. Returns the new
    probabilities' handle."""
    N = batch * vocab
    new = prog.alloc("logits_and_loss", 4 * N)
    prog.free(probs)
    prog.transient("logits_and_loss", 4 * N)
    return new
