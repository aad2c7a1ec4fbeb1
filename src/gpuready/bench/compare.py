"""`compare()`: bench records of several platforms side by side, and which one does the work cheapest.

The cost of a unit of work counts the time before the job runs and the runs that must be repeated:

    hours(W)      = start-up seconds / 3600 + W / (effective throughput per second × 3600)
    cost per unit = price per hour × hours(W) / (1 − p) / W

W is the job's work in the record's unit (`--work`; by default what the fastest platform does in one hour),
effective throughput is all the work of the bench divided by its wall time (stalls included), start-up is the
record's time to ready, and p, the chance that a run must be repeated, is the share of this platform's records
(same label) that ended in a fault (not `ok`, an Xid, or new uncorrectable ECC errors); 1 / (1 − p) is the
expected number of attempts (geometric). With p = 1 no run completed and the cost is unknown.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuready.bench.record import BenchRecord, load_record
from gpuready.catalog.prices import Price as CatalogPrice
from gpuready.errors import InputError

FORMULA = (
    "cost per unit = price per hour × (start-up h + W ÷ (effective throughput × 3600)) ÷ (1 − p) ÷ W;"
    " W = the job's work, p = share of the platform's records that ended in a fault"
)
# how a unit of work is shown: per 1M tokens, per 1k images, per run
UNIT_SCALE = {"tokens": (1_000_000, "1M tokens"), "images": (1_000, "1k images"), "runs": (1, "run")}
# a platform is called unstable when its intervals spread by more than this share of the median, or when it
# was stable for less than STABLE_SHARE of the time it ran (stats.STABLE_BAND defines a stable interval)
UNSTABLE_SPREAD = 0.20
# a machine up this long before the bench was not started for it: its boot is no measure of start-up
LONG_UP_SECONDS = 3600.0
STABLE_SHARE = 0.80


@dataclass(frozen=True)
class Row:
    label: str
    origin: str
    gpu: str | None
    gpu_count: int
    status: str
    error: str | None
    job: str
    unit: str | None
    startup_seconds: float | None
    startup_reference: str
    env_problems: list[str]
    ran_seconds: float
    stable_seconds: float
    median_per_second: float | None
    effective_per_second: float | None
    spread: float | None
    price_per_hour: float | None
    price_source: str | None
    rerun_probability: float
    completed: bool
    hours_for_work: float | None = None
    cost_for_work: float | None = None
    cost_per_unit: float | None = None  # per UNIT_SCALE unit (1M tokens, 1k images, run)
    disk_write_bytes_per_second: float | None = None
    disk_read_bytes_per_second: float | None = None
    peak_device_bytes: int | None = None
    series: list[tuple[float, float]] = field(default_factory=list)  # (seconds since first step, units/s)
    clock_series: list[tuple[float, float]] = field(default_factory=list)  # (seconds, mean SM clock in MHz)
    power_limited_seconds: float = 0.0  # at the power cap (NVML's software power cap reason)

    @property
    def stable_fraction(self) -> float | None:
        return self.stable_seconds / self.ran_seconds if self.ran_seconds > 0 else None


@dataclass(frozen=True)
class Comparison:
    rows: list[Row]
    unit: str | None
    unit_label: str
    work_units: float | None
    work_basis: str
    formula: str
    best: str | None
    reasons: list[str]
    warnings: list[str]
    jobs: list[str] = field(default_factory=list)  # each job once, as the record with the fewest GPUs names it

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "unit_label": self.unit_label,
            "work_units": self.work_units,
            "work_basis": self.work_basis,
            "formula": self.formula,
            "jobs": self.jobs,
            "verdict": {"best": self.best, "reasons": self.reasons},
            "warnings": self.warnings,
            "platforms": [{**asdict(r), "stable_fraction": r.stable_fraction} for r in self.rows],
        }


def load_records(paths: list[Path]) -> list[tuple[str, BenchRecord]]:
    out = []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError("RECORD", f"{path}: cannot read ({exc.strerror})") from None
        except ValueError as exc:
            raise InputError("RECORD", f"{path}: not JSON ({exc})") from None
        out.append((str(path), load_record(data, str(path))))
    return out


def job_key(r: BenchRecord) -> str:
    """What makes two records the same job: the workload per GPU and the seed (how many GPUs ran it is the
    platform, not the job), or the command line."""
    if r.job.kind == "command":
        return " ".join(r.job.argv or [])
    per_gpu = {k: v for k, v in (r.job.workload or {}).items() if k not in ("gpus", "shard")}
    return json.dumps({"workload": per_gpu, "seed": r.job.seed}, sort_keys=True)


def _faulted(r: BenchRecord) -> bool:
    return r.status != "ok" or bool(r.health.xid_events) or bool(r.health.ecc_uncorrected_new)


def _env_problems(r: BenchRecord) -> list[str]:
    out = [f"doctor: {c}" for c in r.doctor.failed] + [f"doctor warns: {w}" for w in r.doctor.warned]
    if r.doctor.error:
        out.append(f"doctor could not run: {r.doctor.error}")
    out += [e for e in r.errors if not e.startswith("doctor:")]
    return list(dict.fromkeys(out))


def _row(origin: str, r: BenchRecord, p: float) -> Row:
    gpus = r.machine.gpus
    tp = r.throughput
    return Row(
        label=r.machine.label,
        origin=origin,
        gpu=gpus[0].name if gpus else None,
        gpu_count=len(gpus),
        status=r.status,
        error=r.error,
        job=r.job.description,
        unit=tp.unit or r.job.unit,
        startup_seconds=r.ready.seconds,
        startup_reference=r.ready.reference,
        env_problems=_env_problems(r),
        ran_seconds=tp.ran_seconds,
        stable_seconds=tp.stable_seconds,
        median_per_second=tp.median_per_second,
        effective_per_second=tp.effective_per_second,
        spread=tp.spread,
        price_per_hour=r.price.per_hour,
        price_source=r.price.source,
        rerun_probability=p,
        completed=not _faulted(r),
        disk_write_bytes_per_second=r.disk.write_bytes_per_second if r.disk else None,
        disk_read_bytes_per_second=r.disk.read_bytes_per_second if r.disk else None,
        peak_device_bytes=r.memory.peak_device_bytes,
        series=[(iv.start_seconds + iv.seconds / 2, iv.per_second) for iv in tp.intervals if iv.per_second is not None],
        clock_series=[
            (float(p["t"]), float(p["sm_clock_mhz"]))
            for p in r.health.series
            if p.get("sm_clock_mhz") is not None and p.get("t") is not None and float(p["t"]) >= 0
        ],
        power_limited_seconds=r.health.throttle_seconds.get("software power cap", 0.0),
    )


def _reprice(row: Row, by_label: dict[str, float], gpu_prices: dict[str, CatalogPrice] | None) -> Row:
    if row.label in by_label:
        return Row(**{**row.__dict__, "price_per_hour": by_label[row.label], "price_source": "--prices (label)"})
    if gpu_prices and row.gpu:
        from gpuready.bench.price import bench_price

        price = bench_price(None, row.gpu, row.gpu_count, prices=gpu_prices)
        if price.per_hour is not None:
            return Row(
                **{**row.__dict__, "price_per_hour": price.per_hour, "price_source": f"--prices: {price.source}"}
            )
    return row


def cost_for(row: Row, work: float) -> tuple[float | None, float | None]:
    """(hours, cost) to do `work` units on this platform by the formula above; None where a term is unknown."""
    if not row.effective_per_second or row.rerun_probability >= 1.0:
        return None, None
    hours = (row.startup_seconds or 0.0) / 3600 + work / (row.effective_per_second * 3600)
    if row.price_per_hour is None:
        return hours, None
    return hours, row.price_per_hour * hours / (1.0 - row.rerun_probability)


def _money(x: float | None) -> str:
    return "unknown" if x is None else f"${x:,.4f}" if x < 1 else f"${x:,.2f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def compare(
    records: list[tuple[str, BenchRecord]],
    *,
    work: float | None = None,
    price_per_hour: dict[str, float] | None = None,
    gpu_prices: dict[str, CatalogPrice] | None = None,
) -> Comparison:
    """Set records side by side. Prices over the records' own: `price_per_hour` (label -> price of the GPUs the
    record used), else `gpu_prices` (a catalog-style table, per GPU-hour, as `plan --prices` reads) for the card
    each record names, times its GPUs."""
    if not records:
        raise InputError("RECORD", "give one or more bench records (files written by `gpuready bench -o`)")
    if work is not None and work <= 0:
        raise InputError("--work", "an amount of work > 0 in the records' unit (tokens, images or runs)")
    by_label: dict[str, list[BenchRecord]] = {}
    for _, r in records:
        by_label.setdefault(r.machine.label, []).append(r)
    p_of = {label: sum(_faulted(r) for r in rs) / len(rs) for label, rs in by_label.items()}
    rows = [_row(origin, r, p_of[r.machine.label]) for origin, r in records]
    if price_per_hour or gpu_prices:
        rows = [_reprice(r, price_per_hour or {}, gpu_prices) for r in rows]
    warnings: list[str] = []
    for row in rows:
        if row.startup_reference in ("boot", "container_start") and (row.startup_seconds or 0) > LONG_UP_SECONDS:
            warnings.append(
                f"{row.label}: the machine was up {(row.startup_seconds or 0) / 3600:.1f} h before its first step; its"
                " start-up counts from the boot; bench with --ordered-at for the time from ordering it"
            )
    units = {r.unit for r in rows if r.unit}
    by_job: dict[str, BenchRecord] = {}
    for _, r in sorted(records, key=lambda item: item[1].job.nproc):
        by_job.setdefault(job_key(r), r)
    jobs = [r.job.description for r in by_job.values()]
    if len(by_job) > 1:
        names = sorted(jobs)
        warnings.append("the records ran different jobs; compare like with like: " + " | ".join(names))
    unit = next(iter(units)) if len(units) == 1 else None
    if len(units) > 1:
        warnings.append(f"the records count different units ({', '.join(sorted(units))}): no cost per unit")
    scale, unit_label = UNIT_SCALE.get(unit or "", (1, unit or "unit"))
    rates = [r.effective_per_second for r in rows if r.effective_per_second and r.completed]
    if work is not None:
        work_units: float | None = work
        basis = "--work"
    elif rates and unit:
        work_units = max(rates) * 3600
        basis = "one hour on the fastest platform"
    else:
        work_units, basis = None, "unknown: no platform completed a run"
    if unit and work_units:
        priced = []
        for row in rows:
            hours, cost = cost_for(row, work_units)
            per_unit = cost / work_units * scale if cost is not None else None
            priced.append(
                Row(**{**row.__dict__, "hours_for_work": hours, "cost_for_work": cost, "cost_per_unit": per_unit})
            )
        rows = priced
    best, reasons = _verdict(rows, unit_label, unit)
    return Comparison(rows, unit, unit_label, work_units, basis, FORMULA, best, reasons, warnings, jobs)


def _verdict(rows: list[Row], unit_label: str, unit: str | None) -> tuple[str | None, list[str]]:
    reasons: list[str] = []
    ok = sorted((r for r in rows if r.completed and r.cost_per_unit is not None), key=lambda r: r.cost_per_unit or 0)
    for r in rows:
        if not r.completed:
            why = r.error or "a hardware fault (Xid or uncorrectable ECC)"
            reasons.append(f"{r.label}: not a candidate: {r.status}: {why}")
        elif r.cost_per_unit is None and unit:
            missing = "price (give --price-per-hour or --prices)" if r.price_per_hour is None else "throughput"
            reasons.append(f"{r.label}: no cost per {unit_label}: unknown {missing}")
    if not ok:
        reasons.insert(0, "no platform completed the job with a known cost")
        return None, reasons
    best = ok[0]
    line = f"{best.label}: lowest cost per {unit_label}, {_money(best.cost_per_unit)}"
    if len(ok) > 1:
        nxt = ok[1]
        more = (nxt.cost_per_unit or 0) / (best.cost_per_unit or 1) - 1
        line += f" ({nxt.label}: {_money(nxt.cost_per_unit)}, {more:+.0%})"
    reasons.insert(0, line)
    cheapest_hour = min((r for r in ok if r.price_per_hour is not None), key=lambda r: r.price_per_hour or 0)
    if cheapest_hour is not best and best.price_per_hour and cheapest_hour.price_per_hour:
        speed = (best.effective_per_second or 0) / (cheapest_hour.effective_per_second or 1)
        reasons.append(
            f"{best.label} costs more per hour ({_money(best.price_per_hour)} vs {_money(cheapest_hour.price_per_hour)}"
            f" on {cheapest_hour.label}) but does {speed:.2f}× the work per second"
        )
    fastest = max(ok, key=lambda r: r.effective_per_second or 0)
    if fastest is not best:
        speed = (fastest.effective_per_second or 0) / (best.effective_per_second or 1)
        reasons.append(f"{fastest.label} is {speed:.2f}× faster but costs more per {unit_label}")
    for r in ok:
        frac = r.stable_fraction
        if (r.spread is not None and r.spread > UNSTABLE_SPREAD) or (frac is not None and frac < STABLE_SHARE):
            reasons.append(
                f"{r.label}: unsteady: intervals spread {r.spread or 0:.0%} of the median, stable for "
                f"{_duration(r.stable_seconds)} of {_duration(r.ran_seconds)}"
            )
        if r.env_problems:
            reasons.append(f"{r.label}: environment: {r.env_problems[0]}")
    starts = [r for r in ok if r.startup_seconds is not None]
    if len(starts) > 1:
        quick = min(starts, key=lambda r: r.startup_seconds or 0)
        slow = max(starts, key=lambda r: r.startup_seconds or 0)
        if quick is not slow:
            reasons.append(
                f"start-up: {quick.label} {_duration(quick.startup_seconds)} ({quick.startup_reference}),"
                f" {slow.label} {_duration(slow.startup_seconds)} ({slow.startup_reference})"
            )
    return best.label, reasons
