"""generate()'s sampling warpers (`--decoding sample`), as the recorded H200 histories h58-h64 show them (transformers
5.17 logits_process.py, torch 2.11): temperature, top-k and top-p over the step's fp32 scores, then softmax and
torch.multinomial. The sizes are multiples of N = batch x vocabulary (fp32 scores: 4N bytes); top-p's torch.sort
takes one of three paths by the rows (sort_scratch), whose cub scratch is 12 bytes an element + 255 from 128 rows and
measured linear fits below (each within 512 bytes on the histories, N from 152 thousand to 9.72 million).
"""

from __future__ import annotations

from typing import Any

from gpuready.memory.program import Program
from gpuready.memory.template import Batch, PerBatch
from gpuready.workload.spec import SAMPLING

# cub's radix-sort scratch for fp32 keys with 8-byte values, bytes = a * N + c: the keys' and values' double buffers
# (12 bytes an element) with the passes' counters (h58-h61: 49,940,991 ... 118,547,967 bytes; h64's one row of
# 151,936: 1,861,631, the fit 1,861,417), and the sort by row's after it (731,647 ... 1,732,095)
SORT_SCRATCH = (12.19045, 9257)
SORT_SCRATCH_SMALL = (0.1778, 3248)
# top-k's radix select scratch: 384 KiB + 512 bytes a row, 5 KiB a row from 128 rows (h58-h64: 76 KiB at one row of
# 151,936, 384-416 KiB at 16-64 rows, 1 MiB at 128 rows of 262,144, 1.25 MiB at 256 rows of 151,936)
TOPK_SELECT = 393_216
# ATen's choice of sort by the rows and the row's length (SortStable.cu): cub's segmented sort from this many rows; a
# sort per row for one row or rows this long
SEGMENTED_FROM_ROWS = 128
PER_ROW_FROM_LENGTH = 1_000_000


def topk_select(prog: Program, rows: Any) -> Any:
    """top-k's radix select scratch for `rows` (TOPK_SELECT's fit, 5 KiB a row from 128 rows: with the rows a template
    symbol, the template holds from there)."""
    return 5120 * rows if prog.from_batch(rows, SEGMENTED_FROM_ROWS) else TOPK_SELECT + 512 * rows


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
        prog.alloc("logits_and_loss", n) for n in (B * 4, B * 8, B * 8, topk_select(prog, B), B * 1024, 3328, 3328)
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
    # TopPLogitsWarper (528-538): torch.sort's values and int64 indices, with its scratch (sort_scratch); softmax then
    # cumsum; two bool masks (<= 1 - top_p, and scattered back); masked_fill
    sorted_values = prog.alloc("logits_and_loss", 4 * N)
    sorted_indices = prog.alloc("logits_and_loss", 8 * N)
    sort_scratch(prog, B, vocab)
    soft = prog.alloc("logits_and_loss", 4 * N)
    cumulative = prog.alloc("logits_and_loss", 4 * N)
    prog.free(soft)
    below = prog.alloc("logits_and_loss", N)
    scattered = prog.alloc("logits_and_loss", N)
    out = prog.alloc("logits_and_loss", 4 * N)
    prog.free_all([sorted_values, sorted_indices, cumulative, below, scattered, kept])
    return out


def sort_scratch(prog: Program, rows: Any, vocab: int) -> None:
    """torch.sort's scratch for `rows` x `vocab` fp32 values along the last dimension (aten/src/ATen/native/cuda/
    SortStable.cu chooses by the rows): from 128 rows cub's segmented radix sort (an int64 index per element, and cub's
    scratch, 12 bytes an element + 255: h62, h63); 2-127 rows a full sort of (value, index and row) pairs then a sort
    by row (two int2 per element, the keys' copy, cub's radix-sort scratch, then the row sort's: h58-h61); one row, a
    radix sort of the row (an index per entry, cub's scratch: h64). With the rows a template symbol, the template holds
    from 128 rows (Program.from_batch), and the template of the batches below it from 2. (Past 2^31 elements ATen
    sorts in chunks of whole rows, each with its own scratch; this counts one chunk of them all, which is more.)"""
    n = rows * vocab
    if prog.from_batch(rows, SEGMENTED_FROM_ROWS):
        reverse = prog.alloc("logits_and_loss", 8 * n)
        prog.transient("logits_and_loss", 12 * n + 255)
        prog.free(reverse)
    elif vocab < PER_ROW_FROM_LENGTH and prog.from_batch(rows, 2):
        a = prog.alloc("logits_and_loss", 8 * n)
        b = prog.alloc("logits_and_loss", 8 * n)
        c = prog.alloc("logits_and_loss", 4 * n)
        prog.transient("logits_and_loss", _scratch(rows, vocab, SORT_SCRATCH))
        prog.free(c)
        prog.transient("logits_and_loss", _scratch(rows, vocab, SORT_SCRATCH_SMALL))
        prog.free(b)
        prog.free(a)
    else:  # one row (or rows of a million or more): a radix sort per row, from the same 0..vocab-1 indices
        initial = prog.alloc("logits_and_loss", 8 * vocab)
        for _ in range(rows):
            prog.transient("logits_and_loss", _scratch(1, vocab, SORT_SCRATCH))
        prog.free(initial)


def draw(prog: Program, batch: int, vocab: int, probs: int) -> int:
    """softmax(next_token_scores) and torch.multinomial(probs, 1): the new probabilities (4N, kept until the next
    step's are made: `probs` is the previous step's, 0 on the first), and multinomial's 4N scratch. Returns the new
    probabilities' handle."""
    N = batch * vocab
    new = prog.alloc("logits_and_loss", 4 * N)
    prog.free(probs)
    prog.transient("logits_and_loss", 4 * N)
    return new
