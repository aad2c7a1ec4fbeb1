"""From the job's step lines and the GPU samples to the record's throughput and health sections.

Pure functions of their inputs (steps as the probe announces them, readings as gpuready/nvml/ returns them), so every
figure in a record can be checked without a GPU.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuready.bench.record import GpuHealth, Interval, Throughput
from gpuready.nvml import BAD_THROTTLE_MASK, GpuReading, XidEvent, throttle_names

# An interval counts as stable when its throughput is within this share of the run's median. A definition,
# not a measurement: a dedicated GPU repeats a fixed job's steps to within a few percent, so a 10% drop over
# a whole interval is a stall (throttling, a noisy neighbour, a slow disk), not noise.
STABLE_BAND = 0.10
MAX_SERIES_POINTS = 240
MIN_INTERVAL_SECONDS = 5.0
INTERVALS_PER_RUN = 30
STEPS_PER_INTERVAL = 4  # an interval spans at least this many median steps, so none is empty by chance


@dataclass(frozen=True)
class Step:
    rank: int
    step: int  # 1 = the first (warm-up) step of its rank
    end: float  # epoch seconds when the step finished
    seconds: float
    units: float


def parse_step(data: dict[str, Any]) -> Step | None:
    try:
        return Step(
            int(data.get("rank", 0)),
            int(data["step"]),
            float(data["end"]),
            float(data["seconds"]),
            float(data.get("units", 0)),
        )
    except (KeyError, TypeError, ValueError):
        return None


def interval_seconds_for(duration_seconds: float, steps: Sequence[Step], requested: float | None) -> float:
    """The interval the run is cut into: as asked, else max(5 s, duration / 30); never under 4 median steps."""
    base = requested if requested is not None else max(MIN_INTERVAL_SECONDS, duration_seconds / INTERVALS_PER_RUN)
    later = [s.seconds for s in steps if s.step > 1]
    if later:
        base = max(base, STEPS_PER_INTERVAL * statistics.median(later))
    return base


def throughput(
    steps: Sequence[Step],
    *,
    unit: str | None,
    interval_seconds: float,
    fault_times: Sequence[float] = (),
) -> tuple[Throughput, float | None]:
    """Per-interval throughput after the warm-up step, its spread and stable time. Returns (throughput, t0)
    with t0 the epoch at which the intervals start (the last rank's first step end), None when nothing ran."""
    if not steps:
        return Throughput(unit=unit, interval_seconds=interval_seconds), None
    firsts = [s for s in steps if s.step == 1]
    t0 = max(s.end for s in firsts) if firsts else min(s.end for s in steps)
    later = sorted((s for s in steps if s.step > 1 and s.end > t0), key=lambda s: s.end)
    first_step = max((s.seconds for s in firsts), default=None)
    if not later:
        return (
            Throughput(
                unit=unit,
                steps=len(steps),
                units_total=sum(s.units for s in steps),
                interval_seconds=interval_seconds,
                first_step_seconds=first_step,
            ),
            t0,
        )
    last_end = later[-1].end
    ran = last_end - t0
    n_full = int(ran // interval_seconds)
    tail = ran - n_full * interval_seconds
    # a trailing part shorter than half an interval joins the one before it
    bounds = [i * interval_seconds for i in range(n_full + 1)]
    if tail >= interval_seconds / 2 or n_full == 0:
        bounds.append(ran)
    else:
        bounds[-1] = ran
    intervals: list[Interval] = []
    for lo, hi in itertools.pairwise(bounds):
        # a step's work is spread over the time it ran, so a step that straddles a boundary counts in both
        units = 0.0
        for s in later:
            end = s.end - t0
            begin = max(0.0, end - s.seconds)
            if end <= lo or begin >= hi:
                continue
            span = end - begin
            units += s.units * ((min(end, hi) - max(begin, lo)) / span if span > 0 else 1.0)
        length = hi - lo
        intervals.append(
            Interval(
                start_seconds=lo,
                seconds=length,
                steps=sum(1 for s in later if lo < s.end - t0 <= hi),
                units=units,
                per_second=units / length if length > 0 else None,
            )
        )
    rates = [i.per_second for i in intervals if i.per_second is not None]
    med = statistics.median(rates) if rates else None
    mean = statistics.fmean(rates) if rates else None
    cv = statistics.pstdev(rates) / mean if rates and mean else None
    faults = [t - t0 for t in fault_times]
    stable = 0.0
    for iv in intervals:
        if iv.per_second is None or not med:
            continue
        in_band = abs(iv.per_second - med) <= STABLE_BAND * med
        faulted = any(iv.start_seconds < f <= iv.start_seconds + iv.seconds for f in faults)
        if in_band and not faulted:
            stable += iv.seconds
    total_units = sum(s.units for s in later)
    return (
        Throughput(
            unit=unit,
            steps=len(steps),
            units_total=sum(s.units for s in steps),
            interval_seconds=interval_seconds,
            intervals=intervals,
            median_per_second=med,
            mean_per_second=mean,
            min_per_second=min(rates) if rates else None,
            max_per_second=max(rates) if rates else None,
            cv=cv,
            spread=(max(rates) - min(rates)) / med if rates and med else None,
            effective_per_second=total_units / ran if ran > 0 else None,
            ran_seconds=ran,
            stable_seconds=stable,
            first_step_seconds=first_step,
        ),
        t0,
    )


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds
    reading: GpuReading


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def health(
    samples: Sequence[Sample],
    *,
    indices: Sequence[int] | None,
    window: tuple[float, float] | None,
    sample_seconds: float,
    xid_events: Sequence[XidEvent] = (),
    xid_supported: bool = False,
    ecc_new: tuple[int | None, int | None] = (None, None),
    t0: float | None = None,
) -> GpuHealth:
    """Clock, power, temperature and throttling of the job's GPUs over `window` (epoch start, end; all samples
    when None), Xid events and new ECC errors. `t0` is where the series' time axis starts."""
    chosen = [s for s in samples if indices is None or s.reading.index in indices]
    if window is not None:
        inside = [s for s in chosen if window[0] <= s.at <= window[1]]
        chosen = inside or chosen
    r = [s.reading for s in chosen]
    clocks = [x.sm_clock_mhz for x in r if x.sm_clock_mhz is not None]
    powers = [x.power_watts for x in r if x.power_watts is not None]
    temps = [x.temperature_c for x in r if x.temperature_c is not None]
    utils = [x.utilization_percent for x in r if x.utilization_percent is not None]
    mems = [x.memory_used_bytes for x in r if x.memory_used_bytes is not None]
    limits = [x.power_limit_watts for x in r if x.power_limit_watts is not None]
    max_clocks = [x.max_sm_clock_mhz for x in r if x.max_sm_clock_mhz is not None]
    gpus = max(1, len({x.index for x in r}))
    throttle: dict[str, float] = {}
    bad = 0.0
    for x in r:
        if x.throttle_reasons is None:
            continue
        # each sample stands for one sample period of its GPU; divided by the GPUs: seconds of the run
        share = sample_seconds / gpus
        for name in throttle_names(x.throttle_reasons):
            throttle[name] = throttle.get(name, 0.0) + share
        if x.throttle_reasons & BAD_THROTTLE_MASK:
            bad += share
    origin = t0 if t0 is not None else (chosen[0].at if chosen else 0.0)
    xids = [
        {"gpu": e.index, "xid": e.xid, "at_seconds": round(e.at - origin, 3)}
        for e in xid_events
        if indices is None or e.index is None or e.index in indices
    ]
    return GpuHealth(
        samples=len(chosen),
        sample_seconds=sample_seconds,
        sm_clock_mhz_median=_median([float(c) for c in clocks]),
        sm_clock_mhz_min=min(clocks) if clocks else None,
        max_sm_clock_mhz=max(max_clocks) if max_clocks else None,
        power_watts_median=_median(powers),
        power_watts_max=max(powers) if powers else None,
        power_limit_watts=max(limits) if limits else None,
        temperature_c_max=max(temps) if temps else None,
        utilization_percent_median=_median([float(u) for u in utils]),
        memory_used_bytes_max=max(mems) if mems else None,
        throttle_seconds={k: round(v, 2) for k, v in sorted(throttle.items())},
        bad_throttle_seconds=round(bad, 2),
        xid_events=xids,
        xid_supported=xid_supported,
        ecc_corrected_new=ecc_new[0],
        ecc_uncorrected_new=ecc_new[1],
        series=_series(chosen, origin),
    )


def _series(samples: Sequence[Sample], origin: float) -> list[dict[str, Any]]:
    """Samples averaged over the job's GPUs at each time, thinned to at most MAX_SERIES_POINTS."""
    by_time: dict[float, list[GpuReading]] = {}
    for s in samples:
        by_time.setdefault(round(s.at, 1), []).append(s.reading)
    times = sorted(by_time)
    step = max(1, -(-len(times) // MAX_SERIES_POINTS))
    out: list[dict[str, Any]] = []
    for t in times[::step]:
        rs = by_time[t]

        def mean(values: list[float]) -> float | None:
            return round(statistics.fmean(values), 1) if values else None

        out.append(
            {
                "t": round(t - origin, 2),
                "sm_clock_mhz": mean([float(x.sm_clock_mhz) for x in rs if x.sm_clock_mhz is not None]),
                "power_watts": mean([x.power_watts for x in rs if x.power_watts is not None]),
                "temperature_c": mean([float(x.temperature_c) for x in rs if x.temperature_c is not None]),
                "utilization_percent": mean(
                    [float(x.utilization_percent) for x in rs if x.utilization_percent is not None]
                ),
                "throttle": sorted({n for x in rs if x.throttle_reasons for n in throttle_names(x.throttle_reasons)}),
            }
        )
    return out


def fault_times(
    samples: Sequence[Sample], indices: Sequence[int] | None, xid_events: Sequence[XidEvent]
) -> list[float]:
    """Epochs at which a job GPU was held back by hardware (bad throttle bits) or raised an Xid."""
    out = [
        s.at
        for s in samples
        if (indices is None or s.reading.index in indices)
        and s.reading.throttle_reasons is not None
        and s.reading.throttle_reasons & BAD_THROTTLE_MASK
    ]
    out += [e.at for e in xid_events if indices is None or e.index is None or e.index in indices]
    return sorted(out)
