"""A simulated device backend: peak memory from a formula, OOM above a capacity. No GPU, no processes.

Used to compare search strategies by the number of runs they need (benchmarks/find_max.py) and by the tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuready.trial.result import Point


@dataclass
class SimulatedDevice:
    """peak(v) = fixed + per_unit·v + quadratic·v² (+ a small deterministic wobble like allocator rounding)."""

    variable: str
    fixed_bytes: float
    per_unit_bytes: float
    capacity_bytes: float
    quadratic_bytes: float = 0.0
    wobble: float = 0.01  # relative, deterministic in v
    load_fraction: float = 0.4  # share of fixed_bytes that loading the model shows
    seconds_per_run: float = 10.0
    calls: list[int] = field(default_factory=list)

    def peak(self, value: int) -> float:
        base = self.fixed_bytes + self.per_unit_bytes * value + self.quadratic_bytes * value * value
        return base * (1.0 + self.wobble * math.sin(value * 1.7))

    def true_max(self, upper: int = 1 << 20, granularity: int = 1) -> int:
        best, v = 0, granularity
        while v <= upper and self.peak(v) <= self.capacity_bytes:
            best, v = v, v + granularity
        return best

    def run_point(self, values: dict[str, int]) -> Point:
        v = int(values[self.variable])
        self.calls.append(v)
        peak = self.peak(v)
        ok = peak <= self.capacity_bytes
        return Point(
            values={self.variable: v},
            ok=ok,
            status="ok" if ok else "oom",
            error=None if ok else "CUDA out of memory (simulated)",
            peak_device_bytes=int(peak) if ok else None,
            load_allocated_bytes=int(self.fixed_bytes * self.load_fraction),
            wall_seconds=self.seconds_per_run,
            gpu_total_bytes=int(self.capacity_bytes),
        )

    def estimator(self, slope_error: float = 0.0, fixed_error: float = 0.0) -> Callable[[int], float | None]:
        """A prediction that is off by the given relative errors on the per-unit and fixed parts."""

        def predict(value: int) -> float | None:
            return (
                self.fixed_bytes * (1 + fixed_error)
                + self.per_unit_bytes * (1 + slope_error) * value
                + self.quadratic_bytes * (1 + slope_error) * value * value
            )

        return predict
