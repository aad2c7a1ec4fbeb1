"""Will the chosen disk hold the job? Model download + checkpoints x how many are kept + dataset.

Sizes on disk (each stated in `assumptions`):
- downloaded weights: params x 2 bytes for language models (bf16/fp16 safetensors as published), x 4 for
  torchvision models (fp32 .pth);
- a training checkpoint (HF Trainer `checkpoint-N/`: model + optimizer.pt + scheduler/rng/state): weights in
  the training precision (fp32 for `mixed`/`fp32`, else 2 bytes) plus optimizer state per trainable parameter:
  AdamW two fp32 moments (8 B), 8-bit AdamW two 1-byte moments (2 B; bitsandbytes), SGD momentum (4 B),
  Adafactor factored moments (~0 B per parameter);
- LoRA/QLoRA: only the adapter is saved, in fp32 (PEFT upcasts adapter weights to float32 by default,
  `autocast_adapter_dtype=True` in `get_peft_model`), plus its optimizer state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpuready.errors import InputError
from gpuready.workload import Workload

GIB = 1024**3
OPTIM_BYTES = {"adamw": 8, "adamw8bit": 2, "sgd": 4, "adafactor": 0}
WARN_FREE_SHARE = 0.10  # warn when the job would leave less than 10 % of the disk free...
WARN_FREE_BYTES = 5 * GIB  # ...or less than 5 GiB


@dataclass(frozen=True)
class JobSizes:
    model_bytes: int
    checkpoint_bytes: int
    trainable_params: int
    assumptions: list[str]


def lora_trainable_params(workload: Workload) -> int:
    """The adapter's parameters: the estimator's count (its LoRA targets, as peft matches them)."""
    from gpuready.memory.estimate import trainable_params
    from gpuready.models import resolve_model

    return trainable_params(resolve_model(workload.model), workload)


def job_sizes(workload: Workload) -> JobSizes:
    """Bytes the workload writes to disk: downloaded weights and one checkpoint."""
    from gpuready.models import resolve_model

    spec = resolve_model(workload.model)
    per_param = 4 if spec.kind == "vision" else 2
    notes = [f"weights downloaded as {per_param} bytes/parameter ({spec.params:,} parameters)"]
    model_bytes = spec.params * per_param
    if not workload.training:
        return JobSizes(model_bytes, 0, 0, [*notes, "inference: no checkpoints"])
    optim = OPTIM_BYTES[workload.optim]
    if workload.method in ("lora", "qlora"):
        trainable = lora_trainable_params(workload)
        ckpt = trainable * (4 + optim)
        notes.append(f"checkpoint = LoRA adapter ({trainable:,} params, fp32) + {optim} B/param optimizer state")
    else:
        trainable = spec.params
        weight = 4 if workload.precision in ("fp32", "mixed") else 2
        ckpt = trainable * (weight + optim)
        notes.append(f"checkpoint = weights ({weight} B/param) + {workload.optim} state ({optim} B/param)")
    return JobSizes(model_bytes, ckpt, trainable, notes)


@dataclass(frozen=True)
class DiskProjection:
    mount_point: str | None
    free_bytes: int | None
    total_bytes: int | None
    need_bytes: int
    items: dict[str, int]
    fits: bool | None  # None when the free space is unknown
    headroom_bytes: int | None
    warn: bool
    message: str
    assumptions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def project_disk(
    *,
    free_bytes: int | None,
    total_bytes: int | None = None,
    mount_point: str | None = None,
    model_bytes: int = 0,
    checkpoint_bytes: int = 0,
    keep_checkpoints: int = 2,
    dataset_bytes: int = 0,
    extra_bytes: int = 0,
    assumptions: list[str] | None = None,
) -> DiskProjection:
    """Compare what the job writes with the free space; warn before the disk fills."""
    if keep_checkpoints < 0:
        raise InputError("--keep-checkpoints", "must be 0 or more")
    items = {
        "model_download": model_bytes,
        "checkpoints": checkpoint_bytes * keep_checkpoints,
        "dataset": dataset_bytes,
        "other": extra_bytes,
    }
    need = sum(items.values())
    notes = list(assumptions or [])
    notes.append(f"{keep_checkpoints} checkpoint(s) kept at once (Trainer `save_total_limit`)")
    if free_bytes is None:
        return DiskProjection(
            mount_point, None, total_bytes, need, items, None, None, False, "free space unknown", notes
        )
    headroom = free_bytes - need
    fits = headroom >= 0
    limit = max(WARN_FREE_BYTES, int(WARN_FREE_SHARE * total_bytes)) if total_bytes else WARN_FREE_BYTES
    warn = fits and headroom < limit
    if not fits:
        message = "does not fit: the disk fills before the job ends"
    elif warn:
        message = "fits, but leaves little free space (under 10 % of the disk or 5 GiB)"
    else:
        message = "fits"
    return DiskProjection(mount_point, free_bytes, total_bytes, need, items, fits, headroom, warn, message, notes)
