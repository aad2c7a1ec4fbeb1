"""Find the largest value of one variable (batch, seq) that runs, in as few runs as possible.

Each run is a fresh process that loads the model: runs are the cost. The search starts from the estimator's
prediction, then uses what it measured: peak memory is close to linear in batch (and in seq, for
flash/efficient attention), so a line through the measured peaks says where the capacity is crossed. The
next value is that crossing, kept strictly inside the bracket (largest value that ran, smallest that did
not); when the line misleads twice in a row the step falls back to bisection, so the search never needs
more than a bisection would after bracketing.

`doubling_then_bisect` is the baseline: start at 1, double until a run fails, then bisect (PyTorch
Lightning's `BatchSizeFinder(mode="binsearch")`,
https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.callbacks.BatchSizeFinder.html).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpuready.search import largest_passing
from gpuready.trial.result import LinearFit, Point
from gpuready.trial.sweep import Backend, PointCallback

PeakPredictor = Callable[[int], float | None]


@dataclass(frozen=True)
class SearchResult:
    variable: str
    max: int  # 0 when even the smallest value failed
    points: list[Point]  # in the order they ran
    start: int
    predicted_max: int | None
    fit: LinearFit | None
    interrupted: bool = False
    strategy: str = "predict-bracket-bisect"
    trace: list[str] = field(default_factory=list)  # why each value was chosen

    @property
    def runs(self) -> int:
        return len(self.points)


def fit_line(variable: str, points: list[Point]) -> LinearFit | None:
    """Least-squares line of peak_device_bytes against the variable over the points that ran."""
    data = [
        (float(p.values[variable]), float(p.peak_device_bytes))
        for p in points
        if p.ok and p.peak_device_bytes is not None
    ]
    xs = {x for x, _ in data}
    if len(xs) < 2:
        return None
    n = len(data)
    mx = sum(x for x, _ in data) / n
    my = sum(y for _, y in data) / n
    sxx = sum((x - mx) ** 2 for x, _ in data)
    slope = sum((x - mx) * (y - my) for x, y in data) / sxx
    return LinearFit(variable, my - slope * mx, slope, n)


def predicted_max(predict: PeakPredictor, capacity: float, low: int, high: int, scale: float = 1.0) -> int | None:
    """Largest v in [low, high] with scale × predict(v) ≤ capacity (predict is a pure function: no runs), by the
    shared pure search (gpuready/search.py); None when the predictor cannot size `low`."""
    if predict(low) is None:
        return None

    def within(v: int) -> bool:
        val = predict(v)
        return val is not None and scale * val <= capacity

    return largest_passing(within, low, high).value


class _Runs:
    """Runs each value at most once and remembers the answers."""

    def __init__(self, backend: Backend, variable: str, granularity: int, on_point: PointCallback | None):
        self.backend, self.variable, self.g, self.on_point = backend, variable, granularity, on_point
        self.points: list[Point] = []
        self.by_value: dict[int, Point] = {}

    def run(self, k: int) -> Point:
        value = k * self.g
        if value not in self.by_value:
            point = self.backend.run_point({self.variable: value})
            self.points.append(point)
            self.by_value[value] = point
            if self.on_point is not None:
                self.on_point(point)
        return self.by_value[value]


# a measured peak this close to the capacity is taken as saturated (seen under `trial --gpu-memory`: ResNet-50 ran
# batch 234 to 280 all at 23.1-23.3 GiB of a 23.25 GiB cap; docs/max_batch/resnet50_fp32_24.json)
SATURATED = 0.97


def find_max(
    backend: Backend,
    variable: str,
    *,
    capacity_bytes: float | None,
    predict: PeakPredictor | None = None,
    granularity: int = 1,
    upper: int = 1 << 20,
    on_point: PointCallback | None = None,
) -> SearchResult:
    """Largest multiple of `granularity` (≤ upper) for which the backend's point runs."""
    from gpuready.trial.runner import Interrupted

    g = max(1, granularity)
    top = max(1, upper // g)
    runs = _Runs(backend, variable, g, on_point)
    trace: list[str] = []
    pred_max: int | None = None
    if predict is not None and capacity_bytes is not None:
        pm = predicted_max(lambda k: predict(k * g), capacity_bytes, 1, top)
        if pm is not None:
            pred_max = pm * g
    start = min(top, max(1, (pred_max or g) // g))
    trace.append(f"start {start * g}: " + ("the estimator's prediction" if pred_max else "no prediction, from 1"))
    lo, hi = 0, top + 1  # lo ran (0: none yet), hi failed (top + 1: none yet)
    k = start
    misses = 0  # model steps in a row that did not halve the bracket
    last_width: int | None = None
    last_was_model = False
    interrupted = False
    try:
        while True:
            point = runs.run(k)
            if point.ok:
                lo = max(lo, k)
            else:
                hi = min(hi, k)
                if point.status not in ("oom", "cuda_error"):
                    # not a memory limit: larger values say nothing new; stop if nothing ran yet
                    trace.append(f"{k * g}: {point.status}, not a memory limit")
                    if lo == 0:
                        break
            if hi - lo <= 1:
                break
            width = hi - lo if hi <= top else None
            if last_was_model and last_width is not None and width is not None:
                misses = misses + 1 if width > last_width // 2 else 0
            nxt, why = _next(runs, variable, g, lo, hi, capacity_bytes, predict, top)
            last_was_model = nxt is not None and misses < 2
            if not last_was_model:
                nxt, why = (lo + hi) // 2 if hi <= top else min(top, max(2 * lo, lo + 1)), "bisect"
                misses = 0
            assert nxt is not None
            nxt = min(max(nxt, lo + 1), hi - 1)
            trace.append(f"{k * g} {'ran' if point.ok else 'failed'}; next {nxt * g} ({why})")
            last_width = width
            k = nxt
    except Interrupted:
        interrupted = True
    fit = fit_line(variable, runs.points)
    return SearchResult(variable, lo * g, runs.points, start * g, pred_max, fit, interrupted, trace=trace)


def _next(
    runs: _Runs,
    variable: str,
    g: int,
    lo: int,
    hi: int,
    capacity: float | None,
    predict: PeakPredictor | None,
    top: int,
) -> tuple[int | None, str]:
    """The next value (in units of g) from the measured points, or None to bisect."""
    ok = [p for p in runs.points if p.ok and p.peak_device_bytes is not None]
    if lo == 0:
        if predict is not None and capacity is not None and hi <= top:
            # nothing ran yet and hi failed: the estimate is low by at least capacity / predict(hi); assume
            # 10% more than that and aim below the capacity
            at_hi = predict(hi * g)
            if at_hi:
                scale = 1.1 * at_hi / capacity if at_hi < capacity else 1.1
                m = predicted_max(lambda k: predict(k * g), capacity / scale, 1, top)
                if m is not None and 1 <= m < hi:
                    return m, "estimator scaled down after a failure"
        return max(1, (hi if hi <= top else 2) // 2), "halve after a failure"
    if capacity is None:
        return None, "no capacity known"
    ok.sort(key=lambda p: p.values[variable])
    largest = ok[-1] if ok else None
    near = [p for p in ok if float(p.peak_device_bytes or 0) >= SATURATED * capacity]
    if len(near) >= 2:
        # near the capacity the allocator trims its cache to fit (it frees cached blocks and retries before it
        # fails): two values that both ran at the capacity show the peaks no longer grow with the variable
        return None, "measured peaks saturate at the capacity"
    if predict is not None and largest is not None:
        # the estimator's shape, scaled to the largest value that ran (its curvature in seq is kept)
        x = int(largest.values[variable])
        guess = predict(x)
        if guess:
            scale = float(largest.peak_device_bytes or 0) / guess
            m = predicted_max(lambda k: predict(k * g), capacity, 1, top, scale)
            if m is not None:
                c = _inside(m, lo, hi, top, runs, g)
                if c is not None:
                    return c, f"estimator scaled by the measured peak ({scale:.3f}x)"
    if len(ok) >= 2:
        # secant through the largest value that ran and one at most 80% of it: the local slope (curvature
        # included) without the noise of two neighbouring values
        top_x = ok[-1].values[variable]
        far = [p for p in ok[:-1] if p.values[variable] <= 0.8 * top_x]
        fit = fit_line(variable, [far[-1], ok[-1]] if far else ok)
        if fit is not None and fit.per_unit_bytes > 0:
            m = fit.max_value(capacity)
            if m is not None:
                return _inside(m // g, lo, hi, top, runs, g), "line through the measured peaks"
    if len(ok) == 1 and largest is not None and largest.load_allocated_bytes is not None:
        # one point: treat what loading took as fixed; the rest grows with the variable. This overstates
        # the slope (gradients and optimizer states are fixed too), so it undershoots: safe.
        x = int(largest.values[variable])
        measured = float(largest.peak_device_bytes or 0)
        fixed = float(largest.load_allocated_bytes) + float(largest.device_overhead_bytes or 0)
        slope = (measured - fixed) / x if x else 0.0
        if slope > 0:
            return _inside(int((capacity - fixed) // slope) // g, lo, hi, top, runs, g), "load peak as fixed part"
    if hi > top:
        return min(top, 2 * lo), "double"
    return None, "bisect"


def _inside(m: int, lo: int, hi: int, top: int, runs: _Runs, g: int) -> int | None:
    """A model's candidate, or None (bisect) when the measurements already contradict the model."""
    if m >= hi:
        return None  # the model says a value that failed would fit
    if m <= lo:
        # the model says lo is the limit: confirm with lo + 1, once; a model that keeps saying so after
        # lo + 1 ran is stale (gallop when nothing failed yet, else bisect)
        confirmed = runs.by_value.get(lo * g)
        if confirmed is not None and runs.points and runs.points[-1] is confirmed and _was_confirm(runs, lo, g):
            return min(top, 2 * lo) if hi > top else None
        return lo + 1
    return m


def _was_confirm(runs: _Runs, lo: int, g: int) -> bool:
    """lo was reached by a +1 step from the value that ran before it."""
    return (lo - 1) * g in runs.by_value and runs.by_value[(lo - 1) * g].ok


def doubling_then_bisect(
    backend: Backend,
    variable: str,
    *,
    granularity: int = 1,
    upper: int = 1 << 20,
    on_point: PointCallback | None = None,
) -> SearchResult:
    """The baseline: 1, 2, 4, ... until a run fails, then bisect between the last success and the failure."""
    g = max(1, granularity)
    top = max(1, upper // g)
    runs = _Runs(backend, variable, g, on_point)
    lo, k = 0, 1
    hi = top + 1
    while k <= top:
        if runs.run(k).ok:
            lo = k
            k *= 2
        else:
            hi = k
            break
    if lo and hi > top:
        hi = top + 1
    while hi - lo > 1 and lo:
        mid = (lo + hi) // 2
        if runs.run(mid).ok:
            lo = mid
        else:
            hi = mid
    return SearchResult(
        variable,
        lo * g,
        runs.points,
        g,
        None,
        fit_line(variable, runs.points),
        strategy="doubling-then-bisect",
    )
