"""What a trial returns: measured points (docs/cli.md `gpuready trial --json`), the max found, the fit."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# How a point ended. "ok" ran to the end; the rest are results to report, never crashes.
STATUSES = ("ok", "oom", "cuda_error", "failed", "timeout", "unsupported", "no_gpu", "skipped")


@dataclass(frozen=True)
class Point:
    """One measured run: the swept values and what the GPU showed. Unknown numbers are None."""

    values: dict[str, Any]
    ok: bool
    status: str
    error: str | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_device_bytes: int | None = None
    step_seconds: float | None = None
    throughput: float | None = None
    throughput_unit: str | None = None
    wall_seconds: float | None = None
    load_allocated_bytes: int | None = None
    device_overhead_bytes: int | None = None
    params: int | None = None
    trainable: int | None = None
    gpu: str | None = None
    gpu_total_bytes: int | None = None
    predicted_device_bytes: int | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)  # per-rank figures under --nproc N
    detail: dict[str, Any] = field(default_factory=dict)  # utilization, duration, exit code, output tail

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def fits(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class LinearFit:
    """Peak memory ≈ fixed_bytes + per_unit_bytes × value, fitted on the points that ran (least squares)."""

    variable: str
    fixed_bytes: float
    per_unit_bytes: float
    points: int
    metric: str = "peak_device_bytes"

    def at(self, value: float) -> float:
        return self.fixed_bytes + self.per_unit_bytes * value

    def max_value(self, capacity_bytes: float) -> int | None:
        """Largest value whose fitted peak stays within capacity (None when the slope says nothing)."""
        if self.per_unit_bytes <= 0:
            return None
        return int((capacity_bytes - self.fixed_bytes) // self.per_unit_bytes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrialResult:
    """A whole trial: a single point, a sweep over one variable, or a find-max search."""

    kind: str  # "probe" or "command"
    target: str  # the model name, or the command line
    variable: str | None
    points: list[Point]
    max: int | None = None
    max_variable: str | None = None
    capacity_bytes: int | None = None
    fit: LinearFit | None = None
    predicted_max: int | None = None
    interrupted: bool = False
    run_id: int | None = None
    chart_path: str | None = None
    calibration: list[dict[str, Any]] = field(default_factory=list)  # measured vs predicted per point

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "target": self.target,
            "variable": self.variable,
            "points": [p.to_json() for p in self.points],
        }
        if self.max_variable is not None:
            data["max"] = self.max
            data["max_variable"] = self.max_variable
            data["predicted_max"] = self.predicted_max
        data["capacity_bytes"] = self.capacity_bytes
        data["fit"] = self.fit.to_json() if self.fit else None
        data["calibration"] = self.calibration
        data["interrupted"] = self.interrupted
        data["run_id"] = self.run_id
        data["chart"] = self.chart_path
        return data
