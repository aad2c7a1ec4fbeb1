"""What to change when a job does not fit: each candidate is re-estimated, not guessed.

Computed only by the callers that show them (`estimate`, `check`, `plan`), once, for the card of their answer;
`estimate()` itself does not (it is called for every card of the catalog).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpuready.memory.estimate import peak_and_fit
from gpuready.workload import Workload


@dataclass(frozen=True)
class Mitigation:
    change: str  # the flags to add or change, as a person would type them
    peak_device_bytes: int
    fits: bool
    note: str
    update: dict[str, Any]  # the same change as workload fields

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _candidates(w: Workload) -> list[tuple[str, dict[str, Any], str]]:
    out: list[tuple[str, dict[str, Any], str]] = []
    if w.training:
        if not w.grad_ckpt:
            out.append(("--grad-ckpt", {"grad_ckpt": True}, "recompute activations in backward (~30% slower)"))
        if w.method == "full":
            out.append(("--method lora", {"method": "lora"}, "train adapters only"))
        # QLoRA computes in 16 bits: a mixed-precision job's QLoRA variant is bf16 (spec.py refuses qlora + mixed)
        qlora = ("--method qlora --precision bf16", {"method": "qlora", "precision": "bf16"})
        if w.precision != "mixed":
            qlora = ("--method qlora", {"method": "qlora"})
        if w.method == "lora":
            out.append((*qlora, "4-bit base weights (needs bitsandbytes)"))
        if w.optim == "adamw" and w.method == "full":
            out.append(("--optim adamw8bit", {"optim": "adamw8bit"}, "8-bit optimizer states (bitsandbytes)"))
        if w.precision in ("fp32", "mixed"):
            out.append(("--precision bf16", {"precision": "bf16"}, "bf16 weights and states"))
        if w.batch > 1:
            accum = w.grad_accum * w.batch
            out.append(
                (
                    f"--batch 1 --grad-accum {accum}",
                    {"batch": 1, "grad_accum": accum},
                    "same effective batch, one sample at a time",
                )
            )
        if not w.grad_ckpt and w.method == "lora":
            out.append((f"{qlora[0]} --grad-ckpt", {**qlora[1], "grad_ckpt": True}, "both"))
        if not w.grad_ckpt and w.method == "full":
            out.append(("--method lora --grad-ckpt", {"method": "lora", "grad_ckpt": True}, "both"))
    else:
        if w.batch > 1:
            out.append((f"--batch {max(1, w.batch // 2)}", {"batch": max(1, w.batch // 2)}, "half the batch"))
        if w.precision in ("fp32", "mixed"):
            out.append(("--precision bf16", {"precision": "bf16"}, "16-bit weights"))
    if w.seq > 512:
        out.append((f"--seq {w.seq // 2}", {"seq": w.seq // 2}, "half the sequence"))
    return out


def suggest(w: Workload, capacity_bytes: int, limit: int = 5) -> list[Mitigation]:
    """Up to `limit` single changes (and two useful pairs), those that fit first, smallest peak first; `fits` by the
    fit rule of memory/fit.py on a card of `capacity_bytes`."""
    found = []
    for change, update, note in _candidates(w):
        variant = w.model_copy(update=update)
        # with the card's size: the variant is sized as it would run there (an FSDP model too large to build whole
        # on one GPU is taken as initialised on the meta device)
        peak, fits = peak_and_fit(variant, capacity_bytes)
        found.append(Mitigation(change, peak, fits, note, update))
    found.sort(key=lambda m: (not m.fits, m.peak_device_bytes))
    return found[:limit]
