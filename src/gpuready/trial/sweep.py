"""Sweeps: run one variable over a list of values, one fresh run per value, everything else held fixed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuready.errors import InputError
from gpuready.trial.result import Point

# Workload fields the built-in probe can sweep (docs/cli.md flags); one at a time.
PROBE_VARIABLES = ("batch", "seq", "new_tokens", "image_size", "lora_r", "grad_accum")
# Variables along which a failure at v means every larger value fails too (memory grows with them).
MONOTONE = ("batch", "seq", "new_tokens", "image_size", "lora_r")


class Backend(Protocol):
    """Measures one point for the given values of the swept variable."""

    def run_point(self, values: dict[str, int]) -> Point: ...


PointCallback = Callable[[Point], None]


@dataclass(frozen=True)
class SweepOutcome:
    variable: str
    points: list[Point]
    interrupted: bool


def parse_values(field: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(field, f"{text!r}: values must be integers separated by commas, e.g. 1,2,4,8") from None
    if not values or any(v < 0 for v in values):
        raise InputError(field, f"{text!r}: give one or more integers ≥ 0, e.g. 1,2,4,8")
    return list(dict.fromkeys(values))


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """`batch=1,2,4,8` -> ("batch", [1, 2, 4, 8]); variables as docs/cli.md names them (dashes allowed)."""
    name, sep, vals = text.partition("=")
    var = name.strip().lstrip("-").replace("-", "_")
    if not sep or var not in PROBE_VARIABLES:
        raise InputError("--sweep", f"{text!r}: use VAR=V1,V2,... with VAR one of {', '.join(PROBE_VARIABLES)}")
    return var, parse_values("--sweep", vals)


def parse_sweep_arg(text: str) -> tuple[str, list[int]]:
    """`--batch_size=1,2,4,8` -> ("--batch_size", [1, 2, 4, 8]) for the user's own command."""
    flag, sep, vals = text.partition("=")
    if not sep or not flag.startswith("-"):
        raise InputError("--sweep-arg", f"{text!r}: use --flag=V1,V2,... (the flag as your script takes it)")
    return flag, parse_values("--sweep-arg", vals)


def run_sweep(
    backend: Backend,
    variable: str,
    values: list[int],
    *,
    skip_after_oom: bool = True,
    on_point: PointCallback | None = None,
) -> SweepOutcome:
    """Run each value in ascending order. After an out-of-memory point, larger values of a variable that
    only grows memory are recorded as skipped, not run. Ctrl-C ends the current point and keeps the rest."""
    from gpuready.trial.runner import Interrupted

    points: list[Point] = []
    oom_at: int | None = None
    for value in sorted(values):
        if oom_at is not None and skip_after_oom and variable.lstrip("-").replace("-", "_") in MONOTONE:
            point = Point(
                values={variable: value},
                ok=False,
                status="skipped",
                error=f"not run: {variable}={oom_at} already ran out of memory",
            )
        else:
            try:
                point = backend.run_point({variable: value})
            except Interrupted:
                return SweepOutcome(variable, points, True)
            if point.status == "oom" and oom_at is None:
                oom_at = value
        points.append(point)
        if on_point is not None:
            on_point(point)
    return SweepOutcome(variable, points, False)
