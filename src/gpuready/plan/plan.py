"""Rank the GPU catalog for one job: fits (the estimator), step time (FLOPs over an achieved fraction of the
card's peak), job hours and cost (prices data).

Step time for training: FLOPs per token 6N for full fine-tuning, 4N for LoRA (no weight gradients of the base),
+2N with activation checkpointing (one more forward), plus attention 12·layers·hidden·seq (Kaplan et al. 2020,
"Scaling Laws for Neural Language Models", §2.1; the 6N rule and the attention term). The achieved fraction of
peak (MFU) is the median over the H200 training rows we measured (MEASURED_MFU below); it is applied to each
card's dense bf16 (or fp32) rate from the catalog, so other cards are scaled by their datasheet, not measured.
Inference has no step-time model yet (unknown is reported as None).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpuready.catalog import Gpu, load_gpus
from gpuready.catalog.prices import Price
from gpuready.errors import InputError
from gpuready.memory.fit import RULE as FIT_RULE
from gpuready.models import ModelSpec, resolve_model
from gpuready.workload import Workload

# Median achieved share of peak of the single-GPU language-model training rows measured on the H200 (torch 2.11,
# eager PyTorch, HF transformers; step_seconds in ../shared/calibration/h200.jsonl and docs/calibration/*.jsonl;
# `python benchmarks/mfu.py`): bf16/fp16/mixed against 989 TFLOP/s, 0.30 over 24 rows (range 0.09-0.40: eager
# attention, phi-3, gemma-2 and small batches at the low end); fp32 against 67 TFLOP/s, 0.55 over 3 (0.53-0.59).
MEASURED_MFU = {"half": 0.30, "fp32": 0.55}


@dataclass(frozen=True)
class PlanOption:
    gpu: str
    count: int
    fits: bool
    headroom_bytes: int
    max_batch: int
    step_seconds: float | None
    job_hours: float | None
    cost: float | None
    price_per_gpu_hour: float | None
    price_source: str | None


@dataclass(frozen=True)
class PlanResult:
    options: list[PlanOption]
    steps: int | None
    tokens_per_step: int
    mitigations: list[dict[str, Any]] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "options": [asdict(o) for o in self.options],
            "steps": self.steps,
            "tokens_per_step": self.tokens_per_step,
            "mitigations": self.mitigations,
            "assumptions": self.assumptions,
        }


def step_flops(spec: ModelSpec, w: Workload) -> float | None:
    """FLOPs of one optimizer step on one GPU (grad_accum micro-batches); None where there is no model."""
    if not w.training or spec.kind != "lm":
        return None
    n = spec.params
    per_token = 6 * n if w.method == "full" else 4 * n
    if w.grad_ckpt:
        per_token += 2 * n
    per_token += 12 * spec.layers * spec.hidden * w.seq
    return float(per_token * w.batch * w.seq * w.grad_accum)


def _step_seconds(flops: float | None, gpu: Gpu, w: Workload) -> float | None:
    if flops is None:
        return None
    if w.precision == "fp32":
        peak, mfu = gpu.fp32_tflops, MEASURED_MFU["fp32"]
    else:
        peak, mfu = gpu.bf16_dense_tflops, MEASURED_MFU["half"]
    if not peak:
        return None
    return flops / (peak * 1e12 * mfu)


def plan(
    workload: Workload,
    prices: dict[str, Price],
    *,
    tokens: int | None = None,
    steps: int | None = None,
    hours: float | None = None,
) -> PlanResult:
    from gpuready.memory import estimate

    given = [x for x in (tokens, steps, hours) if x is not None]
    if len(given) > 1:
        raise InputError("--tokens", "give one of --tokens, --steps or --hours")
    if any(x <= 0 for x in given):
        raise InputError("--tokens", "must be more than 0")
    spec = resolve_model(workload.model)
    count = workload.gpus
    tokens_per_step = workload.batch * workload.seq * workload.grad_accum * count
    if tokens is not None:
        steps = -(-tokens // tokens_per_step)
    flops = step_flops(spec, workload)
    options = []
    for gpu in load_gpus():
        est = estimate(workload, gpu.usable_bytes, spec=spec)
        sec = _step_seconds(flops, gpu, workload)
        job_hours = hours if hours is not None else (sec * steps / 3600 if sec is not None and steps else None)
        price = prices.get(gpu.name)
        cost = job_hours * price.per_gpu_hour * count if job_hours is not None and price else None
        options.append(
            PlanOption(
                gpu.name,
                count,
                bool(est.fits),
                int(est.headroom_bytes or 0),
                int(est.max_batch or 0),
                sec,
                job_hours,
                cost,
                price.per_gpu_hour if price else None,
                price.source if price else None,
            )
        )

    def rank(o: PlanOption) -> tuple[Any, ...]:
        return (
            not o.fits,
            o.cost if o.cost is not None else float("inf"),
            o.price_per_gpu_hour if o.price_per_gpu_hour is not None else float("inf"),
            -o.headroom_bytes,
        )

    options.sort(key=rank)
    mitigations: list[dict[str, Any]] = []
    if not any(o.fits for o in options):  # computed once, for the largest card
        from gpuready.memory.mitigations import suggest

        largest = max(load_gpus(), key=lambda g: g.usable_bytes)
        mitigations = [m.to_json() | {"gpu": largest.name} for m in suggest(workload, largest.usable_bytes)]
    notes = [
        f"{FIT_RULE}; per GPU, on the catalog's memory",
        "step time: FLOPs (6N full, 4N LoRA, +2N checkpointing, + attention) at the measured H200 share of peak "
        f"({MEASURED_MFU['half']:.0%} bf16/fp16, {MEASURED_MFU['fp32']:.0%} fp32) of each card's datasheet rate",
        "prices: per GPU-hour on demand, from data/prices.csv (each with provider, date, source) or --prices",
    ]
    if flops is None:
        notes.append("no step-time model for this job (inference or vision): step_seconds and cost are unknown")
    return PlanResult(options, steps, tokens_per_step, mitigations, notes)
