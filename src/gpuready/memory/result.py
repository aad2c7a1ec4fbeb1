"""What an estimate returns (docs/cli.md, `gpuready estimate --json`), shared by the arithmetic and traced modes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

CARD_KEYS = (
    "gpu_memory_bytes",
    "fits",
    "headroom_bytes",
    "max_batch",
    "allocator_limit_bytes",
    "reserved_on_card_bytes",
    "cache_releases",
    "fit_rule",
)


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak GPU memory of one job, per GPU.

    peak_allocated_bytes: live tensors at the peak, counted in the allocator's blocks (torch.cuda.max_memory_allocated).
    peak_reserved_bytes: what the caching allocator holds from the device (max_memory_reserved).
    peak_device_bytes: reserved + CUDA context and library workspaces (what nvidia-smi shows).
    breakdown: component name -> bytes live at the peak; the components add up to peak_allocated_bytes.
    With a card: fits / headroom_bytes by the one fit rule of memory/fit.py (fits exactly when headroom >= 0).
    """

    model: str
    params: int
    trainable_params: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_device_bytes: int
    phase: str
    breakdown: dict[str, int]
    assumptions: list[str]
    mode: str = "arithmetic"  # or "trace"
    gpu_memory_bytes: int | None = None
    fits: bool | None = None
    headroom_bytes: int | None = None
    max_batch: int | None = None
    phases: dict[str, int] = field(default_factory=dict)  # phase -> peak allocated in that phase
    largest_request_bytes: int = 0  # the largest single allocation after loading
    # with a card (memory/fit.py): what the allocator may reserve there, its peak reserve there when the job fits
    # (under the limit it releases its cache and retries before it fails), how often it released, and the rule
    allocator_limit_bytes: int | None = None
    reserved_on_card_bytes: int | None = None
    cache_releases: int | None = None
    fit_rule: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.gpu_memory_bytes is None:
            for key in CARD_KEYS:
                data.pop(key)
        return data
