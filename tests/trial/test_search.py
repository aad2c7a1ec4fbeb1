"""find-max and doubling-then-bisect against a simulated device (no GPU, no processes)."""

from __future__ import annotations

import pytest

from gpuready.trial.result import Point
from gpuready.trial.search import doubling_then_bisect, find_max, fit_line, predicted_max
from gpuready.trial.simulate import SimulatedDevice
from gpuready.units import GIB

# the benchmark cases of benchmarks/find_max.py: fixed GiB, per-unit GiB, capacity GiB, quadratic, var, step
CASES = [
    (8.2, 6.3, 139.6, 0.0, "batch", 1),
    (17.0, 21.0, 139.6, 0.0, "batch", 1),
    (3.0, 0.55, 79.0, 0.0, "batch", 1),
    (0.9, 0.083, 23.0, 0.0, "batch", 1),
    (14.0, 0.0006, 79.0, 2.0e-8, "seq", 256),
    (8.2, 0.0031, 47.0, 0.0, "seq", 256),
]


def _device(case: tuple[float, float, float, float, str, int]) -> SimulatedDevice:
    fixed, slope, cap, quad, var, _ = case
    return SimulatedDevice(var, fixed * GIB, slope * GIB, cap * GIB, quad * GIB, wobble=0.0)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("error", [0.0, -0.10, 0.10])
def test_find_max_with_estimator_needs_at_most_half_the_runs_of_doubling(case, error) -> None:
    g = case[5]
    baseline = doubling_then_bisect(_device(case), case[4], granularity=g)
    dev = _device(case)
    found = find_max(dev, case[4], capacity_bytes=dev.capacity_bytes, predict=dev.estimator(error), granularity=g)
    assert found.max == dev.true_max(granularity=g) == baseline.max
    assert found.runs <= baseline.runs / 2, (found.runs, baseline.runs, found.trace)
    assert len(dev.calls) == len(set(dev.calls)) == found.runs  # no value runs twice


@pytest.mark.parametrize("case", CASES)
def test_find_max_without_estimator_is_correct_and_no_worse_than_doubling(case) -> None:
    g = case[5]
    dev = _device(case)
    found = find_max(dev, case[4], capacity_bytes=dev.capacity_bytes, granularity=g)
    baseline = doubling_then_bisect(_device(case), case[4], granularity=g)
    assert found.max == dev.true_max(granularity=g)
    assert found.runs <= baseline.runs


def test_find_max_when_nothing_fits_answers_zero() -> None:
    dev = SimulatedDevice("batch", 200 * GIB, 1 * GIB, 80 * GIB)
    found = find_max(dev, "batch", capacity_bytes=dev.capacity_bytes, predict=dev.estimator(0.0))
    assert found.max == 0
    assert dev.calls == [1]


def test_a_failure_that_is_not_memory_stops_the_search() -> None:
    class Broken:
        calls = 0

        def run_point(self, values: dict[str, int]) -> Point:
            Broken.calls += 1
            return Point(values=values, ok=False, status="failed", error="ImportError")

    found = find_max(Broken(), "batch", capacity_bytes=80 * GIB)
    assert found.max == 0 and Broken.calls == 1


def test_predicted_max_matches_a_linear_formula() -> None:
    assert predicted_max(lambda b: 10.0 + 3.0 * b, 100.0, 1, 1 << 20) == 30
    assert predicted_max(lambda b: 10.0 + 3.0 * b, 5.0, 1, 1 << 20) == 0
    assert predicted_max(lambda b: None, 5.0, 1, 10) is None


def test_fit_line_recovers_fixed_and_slope() -> None:
    pts = [Point(values={"batch": b}, ok=True, status="ok", peak_device_bytes=100 + 7 * b) for b in (1, 2, 4)]
    fit = fit_line("batch", pts)
    assert fit is not None
    assert fit.fixed_bytes == pytest.approx(100)
    assert fit.per_unit_bytes == pytest.approx(7)
    assert fit.max_value(170) == 10


def test_saturated_peaks_under_a_memory_cap_make_the_search_bisect() -> None:
    """Regression: under `trial --gpu-memory` ResNet-50's peaks stayed at the cap from batch 234 to 280, the
    model-guided steps crawled upward, and the search took 20 points (docs/max_batch/resnet50_fp32_24.json)."""
    from gpuready.trial.result import Point
    from gpuready.trial.search import find_max

    cap = 24 * 2**30
    limit = 280

    class Capped:
        def run_point(self, values: dict[str, int]) -> Point:
            b = values["batch"]
            ok = b <= limit
            peak = min(cap * 0.99, b * 0.1 * 2**30) if ok else None
            return Point(values=dict(values), ok=ok, status="ok" if ok else "oom", peak_device_bytes=peak)

    def predict(b: int) -> float:  # the estimator thinks 234 is the limit
        return b * cap / 234 * 0.999

    found = find_max(Capped(), "batch", capacity_bytes=cap, predict=predict)
    assert found.max == limit
    assert len(found.points) <= 12
