"""Whether a job fits a card: its allocations replayed through the allocator model under the card's limit.

The one fit rule of both modes (the arithmetic program and the traced events go through the same function):

- the allocator may reserve the card's memory less the device overhead (CUDA context, cuBLAS/cuDNN workspaces)
  and less a margin where a measurement shows one is needed (below);
- the job's allocations are replayed through memory/allocator.py with that limit: when a new segment would take
  the reserve over it, every wholly free cached segment is released and the request retried, and only then does
  the job fail (PyTorch's CUDACachingAllocator `malloc`); `gpuready trial --gpu-memory` sets the same limit on the
  GPU (`torch.cuda.set_per_process_memory_fraction`), so predicted and measured fits compare case by case;
- `fits` is whether the replay completes (under the limit, and under the limit less the margin); `headroom` is
  the limit less the margin less the peak reserve of that replay when it fits (never negative), and the same
  limit less the unlimited peak reserve when it does not (always negative: a job whose unlimited reserve stays
  under a limit never meets it). So `fits` is exactly `headroom >= 0`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gpuready.memory.allocator import replay


class Replayable(NamedTuple):
    """A job's allocation events as the replay takes them: their CUDA streams (None: all on one) and the hint that
    the last span repeats the one before it (Program.repeat_span; None: no hint)."""

    events: Sequence[int]
    streams: list[int] | None = None
    repeat: tuple[int, int] | None = None


# Kept free below the limit where a measurement showed the replay under the limit alone promising a batch that
# failed, by the kind of job, checked on the 105 emulated-card cases of docs/max_batch.md (57 held out: sets 8-20);
# the allocator model itself is exact under a cap: replaying the GPU's own requests recorded under the cap (eleven
# histories, rounds 9 and 10, with cache releases and failures) it reserves, releases and fails where the GPU did.
#
# Two kinds of margin: one always kept (MARGIN_SHARE_*: the limit the replay runs under is the card's less it), and
# one kept only when the fit depends on the allocator releasing its cache (RELEASE_MARGIN_SHARE_OF_LARGEST: the job's
# reserve with no limit is over the limit, so the replay must release its cached segments to go on, and must then
# complete with that much less):
# - "lm" (language-model training and prefill): none, always and on release. The allocator model is exact on the
#   GPU's own requests under a cap (eleven capped histories, rounds 9 and 10), so a release margin could only stand
#   in for events the program got wrong. Round 11 made the program follow the recorded events where the capped
#   cases differed (peft's LoRA backward, the checkpointed recompute's early stop, the residual stream, the final
#   norm: memory/lm/lora_recorded.py, docs/max_batch.md): the program now makes the same large-pool segments in the
#   same order as eight of the capped histories (and two with no cap), and under each history's cap it fails or
#   runs as the GPU did in ten of eleven (phi-3-mini LoRA + checkpointing, whose fused projections keep the generic
#   backward, fails where the GPU ran: cautious). With no margin, all 50 emulated-card cases of docs/max_batch.md
#   are right except one not bracketed (qwen2.5-7b LoRA + checkpointing, 1024 tokens, 40 GiB: 12 predicted, 10 ran,
#   11 not tried); no batch that failed on the GPU completes in the replay under its card's limit, and the least
#   tolerant batch that ran completes with 2% of its largest allocation kept free (`python benchmarks/max_batch.py
#   margins docs/max_batch/cases.tsv`, docs/max_batch/margins_round11.md). Before round 11 the release margin was
#   50% of the largest allocation (the fp32 logits), which cost 7 of the 50 cases. Max-batch set 14 (2026-12-01)
#   found the first batch that failed on the GPU where the replay completed: qwen2.5-3b QLoRA with
#   prepare_model_for_kbit_training, 4 x 1024, on a 40 GiB card (its reserve with no cap exact, history
#   kbit_qwen3b_b4_s1024), and a 1.5% release margin was kept for it. The cause was found after (session 9): peft's
#   prepare_model_for_kbit_training calls torch.cuda.empty_cache() after its fp32 casts (auto_clear_cache), which
#   the kbit histories show as a run of segment frees with no limit set and the program did not make; with it
#   (Program.empty_cache, event 0) the replay fails at that batch on every limit from 1 GiB below to 1 GiB above
#   the card's, the three kbit histories replay exactly (-3.5/-2.5/-1.4% before) and no release margin is needed:
#   all 84 cases are right with none, no batch that failed completes, the least tolerant batch that ran completes
#   with 2% of its largest allocation kept free (`margins`);
# - "vit" (vision transformers in inference), 45% of the largest single allocation: vit_b_16 bf16 inference on a
#   24 GiB card ran 4123 (predicted with this margin) and failed at 5154; the replay alone promises 4537, which was not
#   measured;
# - "vit_train" (vision transformers in training), 100% of the largest single allocation, room for one cuDNN
#   workspace as for ResNets: the patch convolution's workspace is what cuDNN's algorithm takes, 3.2-3.8x its output
#   forward and 3.7-5.4x backward at batches up to 128, none forward at 1360 (histories h29-h33); vit_b_16 bf16 on an
#   80 GiB card ran 1355 and failed at 1360 (set 17; set 4 ran 1365), where the replay with the inference share
#   (45%) promises 1366; the others of sets 8, 16 and 17 keep 80% with 100%;
# - "conv" (ResNet training), 20% of the largest single allocation. It was 100% (room for one cuDNN workspace) while
#   the program made no workspace: resnet50 fp32 on a 24 GiB card ran 280, not 281 (needs over 44%); on 16 GiB 181,
#   not 184 (over 53%); mixed on 40 GiB 920, not 934 (over 48%). Since session 13 the single-GPU program makes each
#   convolution's workspaces as the histories record them (memory/resnet_train.py; the stem's, 1.5x its output in
#   bf16, is now the largest allocation) and the replay alone gives 280, 182, 929 and 376 (resnet101 bf16, 24 GiB:
#   ran 376, failed 382) exact or within the unbracketed gap, and resnet18 bf16 on 24 GiB 1962 (ran 2022): 20% is
#   the least share that keeps all five at or under what ran (15%: 922 where 920 ran and 934 failed);
# - "generate" (inference with generated tokens), 4% of the limit, or 45% of the largest allocation when more:
#   phi-3-mini, 512 + 256 tokens, on 40 GiB ran 78, not 79 (needs over 1.6% of the limit); mistral-7b, 1024 + 128,
#   on 80 GiB ran 224, not 227 (over 0.8%); qwen2.5-7b, 2048 + 128, on 24 GiB ran 21 (at most 8.2% keeps 80% of it).
# - "conv_infer" (ResNet inference under no_grad), 1% of the limit. It was 47% while the program left out batch
#   norm's fp32 copy of its input past 2**31 elements and took cuDNN's workspaces as one cached block (resnet50 bf16
#   on a 40 GiB card ran 4000 and failed at 4050 where the replay promised 5055). The capped histories
#   h36_resnet50_inf_bf16_b4000_cap40 and _b4050 show the 11.96 and 12.11 GiB copies (memory/vision.py
#   LARGE_ELEMENTS; the GPU's 35.0 GB allocated at 4000 is now the program's to the MiB) and every convolution's
#   workspace a moment after its output (INFER_WORKSPACE_PER_OUTPUT, LARGE_CONV_WORKSPACE). The replay alone then
#   gives 4011 there (ran 4011, failed 4012: set 19b), 1953 for resnet101 bf16 on 16 GiB (ran 1953, failed 1954),
#   2674 for resnet18 bf16 on 24 GiB (ran 2674, failed 2675: the copy's threshold), but 6183 for resnet50 bf16 on
#   64 GiB, where 6172 ran in one run and 6183 failed in the next (6158 ran): the GPU's own answer moves by a few
#   tenths of a percent between processes there, as vit_b_16's did between sessions (above). 1% of the limit keeps
#   all five at or under what ran (4011, 6115, 1934, 2674, and 1753 for resnet50 fp32 on 24 GiB, 1755 ran). Set 20,
#   predicted with it: resnet101 bf16 on 40 GiB 4011 and resnet50 bf16 at 320 px on 24 GiB 1310, exact; fp32 and
#   fp16 low (1205 against 1508, 2674 against 3448) until their histories (h39_*) showed fp32's own workspaces and
#   no batch-norm copy in fp16: now 1414 and 2810.
# - "lm_eager" (language-model training with eager attention and checkpointing): no margin always, 100% of the
#   largest single allocation on release. Eager attention's scores are the job's largest blocks after the logits,
#   and where the fit needs a release, whether the backward's three fp32 score tensors find room is decided by
#   blocks the generic recompute does not order as the GPU does: qwen2.5-7b LoRA + checkpointing at 4096 on a 40 GiB
#   card (max-batch set 24) ran 1 and failed at 2 (twice, at a softmax backward's 3.5 GiB scratch, history
#   h44_lora_qwen7b_eager_ckpt_b2_cap40), where the replay of the program completes with up to 68% of its largest
#   allocation kept free (the GPU's own requests replayed fail where the GPU did, a layer earlier). Only with
#   checkpointing: without it (LoRA on the recorded layer, session 15) the four measured cases need no margin
#   (max-batch sets 26 and 27: llama-3.2-1b at 2048 on 24 GiB 0, llama-3.2-3b at 1024 on 40 GiB 2, smollm2-1.7b at
#   1024 on 24 GiB 2, each failing one above; gemma-2-2b at 1024 on 40 GiB ran 3, which this margin made 2).
MARGIN_SHARE_OF_LARGEST = {
    "lm": 0.0,
    "lm_eager": 0.0,
    "vit": 0.45,
    "vit_train": 1.0,
    "conv": 0.2,
    "conv_infer": 0.0,
    "generate": 0.45,
}
MARGIN_SHARE_OF_LIMIT = {
    "lm": 0.0,
    "lm_eager": 0.0,
    "vit": 0.0,
    "vit_train": 0.0,
    "conv": 0.0,
    "conv_infer": 0.01,
    "generate": 0.04,
}
RELEASE_MARGIN_SHARE_OF_LARGEST = {**dict.fromkeys(MARGIN_SHARE_OF_LARGEST, 0.0), "lm_eager": 1.0}
MARGIN_NOTE = {
    "lm": "no margin (measured on the 139 language-model cards of docs/max_batch.md, 96 of them in sets predicted "
    "before they ran: no batch that failed on the GPU completes in the replay under the card's limit)",
    "lm_eager": "no margin, but 100% of the largest single allocation kept free where the fit of a checkpointed job "
    "needs the allocator to release its cache (measured: qwen2.5-7b LoRA + checkpointing with eager attention at "
    "4096 tokens on a 40 GiB card ran batch 1 and failed at 2, where the replay alone completes; docs/max_batch.md)",
    "vit": "margin 45% of the largest single allocation (measured: vit_b_16 bf16 inference on a 24 GiB card ran "
    "batch 4123, failed at 5154; the replay alone promises 4537, not measured; docs/max_batch.md)",
    "vit_train": "margin 100% of the largest single allocation, room for the patch convolution's cuDNN workspace "
    "(measured: vit_b_16 bf16 training on an 80 GiB card ran batch 1355, failed at 1360, where the replay alone "
    "promises 1366; docs/max_batch.md)",
    "conv": "margin 20% of the largest single allocation, for the weight gradients' larger cuDNN workspaces (measured: "
    "resnet50 mixed on a 40 GiB card ran batch 920 and failed at 934, where the replay alone promises 929; "
    "docs/max_batch.md)",
    "conv_infer": "margin 1% of the limit (measured: resnet50 bf16 inference on a 64 GiB card ran batch 6172 in one "
    "run and failed at 6183 in another, where the replay of the job, cuDNN's workspaces and batch norm's fp32 copies "
    "included, promises 6183; docs/max_batch.md)",
    "generate": "margin 4% of the limit, or 45% of the largest single allocation when more (measured: phi-3-mini "
    "generating 256 tokens from 512 on a 40 GiB card ran batch 78, not 79; docs/max_batch.md)",
}


RULE = (
    "fits: the job's allocations replayed through the caching-allocator model with the card's memory less the "
    "device overhead (and less the kind's margin) as the limit; when a segment would not fit, the cached free "
    "segments are released and the request retried, as PyTorch does (a fit that needs that release must also "
    "complete with the kind's release margin taken off, where one is measured); headroom: that limit less the peak "
    "reserve (negative: short)"
)
MAX_BATCH_RULE = (
    "max batch: the largest batch that fits with the 8 batches below it fitting too (so every smaller batch, for "
    "answers up to 9), searched from where the live tensors alone would fill the limit; fits is not always "
    "monotone in the batch near the limit"
)


@dataclass(frozen=True)
class Fit:
    """A job against one card, by the rule above."""

    gpu_memory_bytes: int
    limit_bytes: int  # what the allocator may reserve, less the margin: card - device overhead - margin
    margin_bytes: int
    fits: bool
    reserved_bytes: int  # peak reserve under the limit when it fits, the unlimited peak reserve when not
    releases: int  # how often the allocator released its cache to go on (0: the limit was never met)

    @property
    def headroom_bytes(self) -> int:
        return self.limit_bytes - self.reserved_bytes


def fit_margin_bytes(kind: str, largest_request: int, limit_bytes: int) -> int:
    """The margin always kept below the limit for a job of `kind` ("lm", "lm_eager", "vit", "vit_train", "conv",
    "conv_infer", "generate"; see above)."""
    return int(max(MARGIN_SHARE_OF_LARGEST[kind] * largest_request, MARGIN_SHARE_OF_LIMIT[kind] * limit_bytes))


def release_margin_bytes(kind: str, largest_request: int) -> int:
    """The margin kept below the limit, for a job of `kind`, when its fit depends on the allocator releasing its
    cache (see above)."""
    return int(RELEASE_MARGIN_SHARE_OF_LARGEST[kind] * largest_request)


def allocator_limit(gpu_memory_bytes: int, device_overhead_bytes: int) -> int:
    """What `gpuready trial --gpu-memory` lets the allocator reserve on the GPU (trial/api.py) and the replay."""
    return gpu_memory_bytes - device_overhead_bytes


def judge(
    gpu_memory_bytes: int,
    device_overhead_bytes: int,
    kind: str,
    *,
    largest_request: int,
    unlimited_reserved: int,
    peak_allocated: int,
    extra_reserved: int,
    events: Callable[[], Replayable],
) -> Fit:
    """The job on a card of `gpu_memory_bytes`, for both modes. `events` gives the allocation events and their
    streams, asked for only when the unlimited peaks do not decide (building them again can cost a second)."""
    limit = allocator_limit(gpu_memory_bytes, device_overhead_bytes)
    margin = fit_margin_bytes(kind, largest_request, limit)
    on_release = release_margin_bytes(kind, largest_request)
    inner = limit - margin
    easy = unlimited_reserved <= inner or peak_allocated > inner - on_release
    evs = Replayable(()) if easy else events()
    fits, reserved, releases = replay_under_limit(
        evs.events,
        inner,
        unlimited_reserved=unlimited_reserved,
        peak_allocated=peak_allocated,
        streams=evs.streams,
        repeat=evs.repeat,
        extra_reserved=extra_reserved,
        margin_bytes=on_release,
    )
    # the release margin counts where the fit depends on a release (the reserve with no limit is over the limit)
    applied = margin + (on_release if unlimited_reserved > inner else 0)
    return Fit(gpu_memory_bytes, limit - applied, applied, fits, reserved, releases)


def replay_under_limit(
    events: Sequence[int],
    limit_bytes: int,
    *,
    unlimited_reserved: int,
    peak_allocated: int,
    streams: list[int] | None = None,
    extra_reserved: int = 0,
    margin_bytes: int = 0,
    repeat: tuple[int, int] | None = None,
) -> tuple[bool, int, int]:
    """(fits, peak reserve, releases) of `events` under `limit_bytes` (the card less the device overhead and the
    kind's margin).

    A job whose reserve with no limit stays within the limit fits as it is (the allocator never releases). Otherwise
    the allocator must release its cache to go on, and the job must complete under the limit and under the limit
    less `margin_bytes` (the release margin) both: near the limit, when the allocator releases its cache decides
    whether a large request finds room, and the replay of a smaller limit can complete where the larger fails. The
    reserve returned is that of the replay under the limit less the margin when it fits, else the unlimited one.

    unlimited_reserved / peak_allocated: the replay's peaks with no limit (the replay under a limit is the same
    replay until the limit is first met, so a job whose unlimited reserve is within the limit fits as it is, and one
    whose live tensors alone exceed it cannot). extra_reserved: held outside the replayed events at the peak
    (cuDNN's cached workspace), counted when it fits within the limit; under a limit cuDNN takes algorithms with
    smaller workspaces, so it does not decide the fit (the margin keeps room for one)."""
    failed = False, unlimited_reserved + extra_reserved, 0
    inner = limit_bytes - margin_bytes
    if unlimited_reserved <= limit_bytes:
        return True, min(limit_bytes, unlimited_reserved + extra_reserved), 0
    if peak_allocated > inner:
        return failed
    if unlimited_reserved > limit_bytes and replay(events, limit_bytes, streams, repeat).oom_event is not None:
        return failed
    stats = replay(events, inner, streams, repeat)
    if stats.oom_event is not None:
        return False, unlimited_reserved + extra_reserved, stats.releases
    return True, stats.peak_reserved_bytes, stats.releases
