"""Rank the GPU catalog for one job by the cost of the work: fits (the estimator), step time and throughput
(plan/steptime.py, the job's ops costed on each card), and the price (prices data).

Without a job length the ranking is by cost per unit of work: per 1M tokens (trained, generated, or prefilled)
or per 1k images, = price per GPU-hour x GPUs x step seconds / units per step. With --tokens or --steps it is by
the job's total cost (time = steps x step seconds); with --hours by the cost of the work done in those hours
(the same order as per unit, the totals shown). Where a card holds the job only with a change that keeps the
work the same (activation checkpointing, a smaller micro-batch with gradient accumulation, an 8-bit optimizer;
inference: a smaller batch), its time is that of the changed job. A card's own measurements (trial/bench
records, plan/calibrate.py) scale its step time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from gpuready.catalog import Gpu, load_gpus
from gpuready.catalog.prices import Price
from gpuready.errors import InputError
from gpuready.memory.fit import RULE as FIT_RULE
from gpuready.models import ModelSpec, resolve_model
from gpuready.plan.steptime import StepTime, step_time
from gpuready.search import first_passing
from gpuready.workload import Workload

if TYPE_CHECKING:
    from gpuready.memory.mitigations import Mitigation

UNIT_SCALE = {"tokens": 1_000_000, "images": 1_000}
UNIT_LABEL = {"tokens": "1M tokens", "images": "1k images"}
UNIT_SCALE_TEXT = {"tokens": "1e6", "images": "1e3"}


@dataclass(frozen=True)
class PlanOption:
    gpu: str
    count: int
    fits: bool  # as given
    headroom_bytes: int
    max_batch: int
    step_seconds: float | None
    job_hours: float | None
    cost: float | None
    price_per_gpu_hour: float | None
    price_source: str | None
    mitigation: str | None = None  # the change that makes the job fit on this card (None: fits as given)
    throughput: float | None = None  # units (tokens or images) per second, all GPUs
    unit: str = "tokens"
    cost_per_unit: float | None = None  # $ per 1M tokens or per 1k images
    units: float | None = None  # units of work in the job (with a length)
    calibration: float = 1.0  # this card's measured/predicted step-time factor (1.0: no records)

    @property
    def runs(self) -> bool:
        """Holds the job as given or with a same-work change."""
        return self.fits or self.mitigation is not None


@dataclass(frozen=True)
class PlanResult:
    options: list[PlanOption]
    steps: int | None
    tokens_per_step: int
    # what would fit the catalog's largest card (mitigations_gpu), computed only when no card runs the job
    mitigations: list[Mitigation] = field(default_factory=list)
    mitigations_gpu: str | None = None
    assumptions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unit: str = "tokens"
    units_per_step: int = 0
    ranked_by: str = "cost per unit"  # or "job cost"
    cost_formula: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "warnings": self.warnings,
            "options": [asdict(o) | {"runs": o.runs} for o in self.options],
            "steps": self.steps,
            "tokens_per_step": self.tokens_per_step,
            "unit": self.unit,
            "unit_label": UNIT_LABEL[self.unit],
            "units_per_step": self.units_per_step,
            "ranked_by": self.ranked_by,
            "cost_formula": self.cost_formula,
            "mitigations": [m.to_json() | {"gpu": self.mitigations_gpu} for m in self.mitigations],
            "assumptions": self.assumptions,
        }


def step_flops(spec: ModelSpec, w: Workload) -> float | None:
    """FLOPs of one optimizer step on one GPU from the job's ops (plan/ops/); None for inference."""
    if not w.training:
        return None
    from gpuready.plan.ops import training_ops

    return sum(op.flops for op in training_ops(spec, w))


def _same_work_variants(w: Workload) -> list[tuple[str, Workload]]:
    """Changes that keep the work (tokens or images per optimizer step, the method, the model), alone and
    combined: activation checkpointing, micro-batch 1 with gradient accumulation, an 8-bit AdamW."""
    out: list[tuple[str, Workload]] = []
    if w.training:
        toggles: list[tuple[str, dict[str, Any]]] = []
        if not w.grad_ckpt:
            toggles.append(("--grad-ckpt", {"grad_ckpt": True}))
        if w.batch > 1:
            accum = w.batch * w.grad_accum
            toggles.append((f"--batch 1 --grad-accum {accum}", {"batch": 1, "grad_accum": accum}))
        if w.optim == "adamw" and w.method == "full":
            toggles.append(("--optim adamw8bit", {"optim": "adamw8bit"}))
        for mask in range(1, 2 ** len(toggles)):
            chosen = [t for i, t in enumerate(toggles) if mask >> i & 1]
            update: dict[str, Any] = {}
            for _, u in chosen:
                update |= u
            out.append((" ".join(c for c, _ in chosen), w.model_copy(update=update)))
    else:
        b = w.batch // 2
        while b >= 1:
            out.append((f"--batch {b}", w.model_copy(update={"batch": b})))
            b //= 2
    return out


class _Fits:
    """Whether a workload fits a capacity, with estimates cached per (variant, capacity). Fitting is monotone in
    capacity, so a variant is estimated only at the few capacities a binary search over the catalog needs."""

    def __init__(self, spec: ModelSpec, capacities: list[int]) -> None:
        self.spec = spec
        self.capacities = sorted(set(capacities))
        self.cache: dict[tuple[str, int], bool] = {}
        self.smallest: dict[str, int | None] = {}

    def _fits(self, change: str, w: Workload, capacity: int) -> bool:
        from gpuready.memory import estimate

        key = (change, capacity)
        if key not in self.cache:
            self.cache[key] = bool(estimate(w, capacity, spec=self.spec, find_max_batch=False).fits)
        return self.cache[key]

    def fits(self, change: str, w: Workload, capacity: int) -> bool:
        if change not in self.smallest:
            caps = self.capacities
            first = first_passing(lambda i: self._fits(change, w, caps[i]), 0, len(caps) - 1).value
            self.smallest[change] = caps[first] if first < len(caps) else None
        small = self.smallest[change]
        return small is not None and capacity >= small


def _cost_per_unit(st: StepTime, price: Price | None, count: int) -> float | None:
    if price is None or st.units_per_second <= 0:
        return None
    return price.per_gpu_hour * count / 3600 / st.units_per_second * UNIT_SCALE[st.unit]


def _grouped(card_notes: set[str]) -> list[str]:
    """'T4 has no bf16 ...' and 'V100 ... has no bf16 ...' become one line naming both cards."""
    by_rest: dict[str, list[str]] = {}
    plain = []
    for note in sorted(card_notes):
        card, sep, rest = note.partition(" has no ")
        if sep:
            by_rest.setdefault(rest, []).append(card)
        else:
            plain.append(note)
    return [f"{', '.join(cards)}: no {rest}" for rest, cards in by_rest.items()] + plain


def plan(
    workload: Workload,
    prices: dict[str, Price],
    *,
    tokens: int | None = None,
    steps: int | None = None,
    hours: float | None = None,
    calibration: dict[str, float] | None = None,
    gpus: tuple[Gpu, ...] | None = None,
    spec: ModelSpec | None = None,
) -> PlanResult:
    """Every catalog card for `workload`, those that run it first, cheapest work first (module docstring).
    `calibration`: catalog name -> measured/predicted step-time factor (plan/calibrate.py)."""
    from gpuready.memory.sweep import estimate_cards

    given = {flag: x for flag, x in (("--tokens", tokens), ("--steps", steps), ("--hours", hours)) if x is not None}
    if len(given) > 1:
        raise InputError(next(iter(given)), "give one of --tokens, --steps or --hours")
    for flag, x in given.items():
        if x <= 0:
            raise InputError(flag, f"got {x:g}; allowed: more than 0")
    spec = spec or resolve_model(workload.model, workload.as_family)
    if tokens is not None and spec.kind == "vision":
        raise InputError("--tokens", "a vision job counts images, not tokens; give --steps or --hours")
    cards = gpus if gpus is not None else load_gpus()
    calibration = calibration or {}
    count = workload.gpus
    tokens_per_step = workload.batch * workload.seq * workload.grad_accum * count
    variants = _same_work_variants(workload)
    fits_cache = _Fits(spec, [g.usable_bytes for g in cards])
    options = []
    card_notes: set[str] = set()
    unit = "images" if spec.kind == "vision" else "tokens"
    units_per_step = 0
    job_steps = steps
    base_times: dict[str, StepTime] = {}

    def time_cards() -> None:  # (in this thread while the cards' replays run on others)
        for gpu in cards:
            base_times[gpu.name] = step_time(workload, gpu, spec=spec, calibration=calibration.get(gpu.name, 1.0))

    estimates = estimate_cards(workload, [g.usable_bytes for g in cards], spec=spec, meanwhile=time_cards)
    for gpu in cards:
        est = estimates[gpu.usable_bytes]
        run_w, change = workload, None
        factor = calibration.get(gpu.name, 1.0)
        st = base_times[gpu.name]
        if not est.fits:
            # the fastest same-work change that fits this card
            best: tuple[float, str, Workload, StepTime] | None = None
            for ch, variant in variants:
                if fits_cache.fits(ch, variant, gpu.usable_bytes):
                    vst = step_time(variant, gpu, spec=spec, calibration=factor)
                    if best is None or vst.seconds < best[0]:
                        best = (vst.seconds, ch, variant, vst)
            if best is not None:
                _, change, run_w, st = best
        units_per_step = units_per_step or st.units_per_step
        card_notes.update(st.notes)
        unit = st.unit
        price = prices.get(gpu.name)
        if tokens is not None:
            job_steps = -(-tokens // st.units_per_step)
        sec = st.seconds
        job_hours = hours if hours is not None else (sec * job_steps / 3600 if job_steps else None)
        cost = job_hours * price.per_gpu_hour * count if job_hours is not None and price else None
        units = None
        if job_hours is not None:
            units = (
                job_hours * 3600 * st.units_per_second
                if hours is not None
                else float(st.units_per_step * (job_steps or 0))
            )
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
                mitigation=change,
                throughput=st.units_per_second,
                unit=st.unit,
                cost_per_unit=_cost_per_unit(st, price, count),
                units=units,
                calibration=factor,
            )
        )
        del run_w
    by_job = tokens is not None or steps is not None

    def rank(o: PlanOption) -> tuple[Any, ...]:
        inf = float("inf")
        primary = o.cost if by_job else o.cost_per_unit
        return (
            not o.runs,
            primary if primary is not None else inf,
            o.step_seconds if o.step_seconds is not None else inf,
            -o.headroom_bytes,
        )

    options.sort(key=rank)
    mitigations: list[Mitigation] = []
    mitigations_gpu = None
    if not any(o.runs for o in options):
        from gpuready.memory.mitigations import suggest

        largest = max(cards, key=lambda g: g.usable_bytes)
        mitigations, mitigations_gpu = suggest(workload, largest.usable_bytes), largest.name
    label = UNIT_LABEL[unit]
    formula = (
        f"cost per {label} = $/GPU-h x GPUs x step s / {unit} per step x {UNIT_SCALE_TEXT[unit]} / 3600"
        if not by_job
        else "job cost = $/GPU-h x GPUs x steps x step s / 3600"
    )
    if hours is not None:
        formula = f"cost = $/GPU-h x GPUs x {hours:g} h; ranked by {formula}"
    notes = [
        f"{FIT_RULE}; per GPU, on the catalog's memory",
        "step time: the job's ops (matmuls by shape at the card's dense peak for the dtype, attention by kernel, "
        "element-wise and optimizer bytes at its memory bandwidth, collectives at its link) with efficiencies "
        "fitted on H200 measurements; other cards scaled by their datasheets (docs/steptime.md)",
        "a card that holds the job only with a change that keeps the work (e.g. --grad-ckpt) is timed with it",
        "prices: per GPU-hour on demand, from data/prices.csv (each with provider, date, source) or --prices",
    ]
    notes += _grouped(card_notes)
    if calibration:
        cards_cal = ", ".join(f"{k} x{v:.2f}" for k, v in sorted(calibration.items()))
        notes.append(f"step times scaled by this machine's measured records: {cards_cal}")
    from gpuready.catalog.cards import bf16_supported

    warnings = []
    no_bf16 = [g.name for g in cards if bf16_supported(g) is False]
    if workload.precision in ("bf16", "mixed") and no_bf16:
        warnings.append(
            f"no bf16 on {', '.join(no_bf16)} (compute capability below 8.0): use --precision fp16 or fp32 there"
        )
    return PlanResult(
        options,
        job_steps,
        tokens_per_step,
        mitigations,
        mitigations_gpu,
        notes,
        warnings,
        unit=unit,
        units_per_step=units_per_step,
        ranked_by="job cost" if by_job else "cost per unit",
        cost_formula=formula,
    )
