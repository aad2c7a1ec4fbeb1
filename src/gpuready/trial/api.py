"""The library entry points: `trial_probe` (the built-in probe) and `trial_command` (the user's own command).

Both return a TrialResult, never print, and record every point in the results database when one is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuready.errors import InputError
from gpuready.store import ResultsDB
from gpuready.trial import runner
from gpuready.trial import search as search_mod
from gpuready.trial.backend import CommandBackend, ProbeBackend
from gpuready.trial.result import LinearFit, Point, TrialResult
from gpuready.trial.sweep import Backend, PointCallback, run_sweep
from gpuready.workload import Workload

Predictor = Callable[[int], float | None]
# Granularity of --find-max: batch by 1; seq by 256 tokens (finer steps cost runs and rarely matter).
FIND_MAX_GRANULARITY = {"batch": 1, "seq": 256}
FIND_MAX_UPPER = {"batch": 1 << 16, "seq": 1 << 20}


def estimator_predictor(workload: Workload, variable: str) -> Predictor | None:
    """peak_device_bytes predicted by gpuready.memory.estimate for each value of `variable` (None where the
    estimator cannot size the job, e.g. a model type it does not know)."""
    from gpuready.errors import GpureadyError
    from gpuready.memory import estimate

    def predict(value: int) -> float | None:
        try:
            est = estimate(workload.model_copy(update={variable: value}))
        except GpureadyError:
            return None
        return float(est.peak_device_bytes)

    return predict


def _record(db: ResultsDB | None, run_id: int | None, on_point: PointCallback | None) -> PointCallback:
    def callback(point: Point) -> None:
        if db is not None and run_id is not None:
            db.add_point(run_id, point.to_json())
        if on_point is not None:
            on_point(point)

    return callback


def _capacity(points: list[Point], given: int | None) -> int | None:
    if given is not None:
        return given
    totals = [p.gpu_total_bytes for p in points if p.gpu_total_bytes]
    return max(totals) if totals else None


def _calibration(points: list[Point], predict: Predictor | None, variable: str | None) -> list[dict[str, Any]]:
    """Measured vs predicted peak device memory for each point that ran."""
    out: list[dict[str, Any]] = []
    if predict is None or variable is None:
        return out
    for p in points:
        if not p.ok or p.peak_device_bytes is None:
            continue
        pred = predict(int(p.values[variable]))
        if pred:
            out.append(
                {
                    "values": p.values,
                    "measured_device_bytes": p.peak_device_bytes,
                    "predicted_device_bytes": int(pred),
                    "error_fraction": (pred - p.peak_device_bytes) / p.peak_device_bytes,
                }
            )
    return out


def run_status(points: list[Point], interrupted: bool, found_max: int | None = None) -> str:
    """A run's status in the results database: interrupted; ok (every point ran; a find-max found a value);
    partial (some points ran); failed (none ran). A find-max expects failures past the limit, so its status is
    whether it found a value. Skipped points (a sweep past a failure) do not count."""
    if interrupted:
        return "interrupted"
    if found_max is not None:
        return "ok" if found_max > 0 else "failed"
    tried = [p for p in points if p.status != "skipped"]
    ran = sum(1 for p in tried if p.ok)
    if tried and ran == len(tried):
        return "ok"
    return "partial" if ran else "failed"


def run_backend(
    backend: Backend,
    *,
    kind: str,
    target: str,
    variable: str,
    values: list[int] | None = None,
    find_max: bool = False,
    predict: Predictor | None = None,
    capacity_bytes: int | None = None,
    db: ResultsDB | None = None,
    workload: dict[str, Any] | None = None,
    on_point: PointCallback | None = None,
    granularity: int = 1,
    upper: int = 1 << 16,
) -> TrialResult:
    """A single point, a sweep or a find-max over any backend, recorded in `db`."""
    run_id = db.start_run(kind, target, variable, workload) if db is not None else None
    record = _record(db, run_id, on_point)
    max_value: int | None = None
    pred_max: int | None = None
    fit: LinearFit | None
    if find_max:
        if capacity_bytes is None:
            from gpuready.nvml import Nvml

            mem = Nvml().memory(0)
            capacity_bytes = mem.total_bytes if mem else None
        found = search_mod.find_max(
            backend,
            variable,
            capacity_bytes=capacity_bytes,
            predict=predict,
            granularity=granularity,
            upper=upper,
            on_point=record,
        )
        points, interrupted, fit = found.points, found.interrupted, found.fit
        max_value, pred_max = found.max, found.predicted_max
    else:
        outcome = run_sweep(backend, variable, values or [], on_point=record)
        points, interrupted = outcome.points, outcome.interrupted
        fit = search_mod.fit_line(variable, points)
    capacity = _capacity(points, capacity_bytes)
    if db is not None and run_id is not None:
        db.finish_run(run_id, run_status(points, interrupted, max_value if find_max else None), max_value)
    return TrialResult(
        kind=kind,
        target=target,
        variable=variable,
        points=points,
        max=max_value,
        max_variable=variable if find_max else None,
        capacity_bytes=capacity,
        fit=fit,
        predicted_max=pred_max,
        interrupted=interrupted,
        run_id=run_id,
        calibration=_calibration(points, predict, variable),
    )


def trial_probe(
    workload: Workload,
    *,
    sweep: tuple[str, list[int]] | None = None,
    find_max: str | None = None,
    nproc: int | None = None,
    timeout: float | None = None,
    db: ResultsDB | None = None,
    predictor: Predictor | bool | None = True,
    on_point: PointCallback | None = None,
    on_line: Callable[[str], None] | None = None,
    emulate_gpu_bytes: int | None = None,
    run: runner.RunFn | None = None,
) -> TrialResult:
    """Measure `workload` with the built-in probe: one point, a sweep, or the largest batch/seq that runs.

    emulate_gpu_bytes: behave like a card of this size (PyTorch's allocator capped at it, less the CUDA context
    and workspaces the estimator counts outside the allocator).

    predictor: True = the estimator's (when available), None/False = none, or a callable value -> bytes.
    """
    if sweep is not None and find_max is not None:
        raise InputError("--find-max", "use either --sweep or --find-max, one variable at a time")
    if find_max is not None and find_max not in FIND_MAX_GRANULARITY:
        raise InputError("--find-max", f"{find_max!r}: allowed: batch, seq")
    if nproc is not None and nproc < 1:
        raise InputError("--nproc", "an integer ≥ 1")
    cap = None
    if emulate_gpu_bytes is not None:
        from gpuready.memory.estimate import device_overhead_bytes

        cap = emulate_gpu_bytes - device_overhead_bytes(workload)
        if cap <= 0:
            raise InputError("--gpu-memory", "smaller than the CUDA context alone")
    backend = ProbeBackend(workload, nproc=nproc, on_line=on_line, memory_cap_bytes=cap)
    if run is not None:  # a fake process runner, for tests
        backend.run = run
    if timeout is not None:
        backend.timeout = timeout
    variable = find_max or (sweep[0] if sweep else "batch")
    values = sweep[1] if sweep else [int(getattr(workload, variable))]
    predict: Predictor | None
    if predictor is True:
        predict = estimator_predictor(workload, variable)
    elif predictor is False or predictor is None:
        predict = None
    else:
        predict = predictor
    return run_backend(
        backend,
        capacity_bytes=emulate_gpu_bytes,
        kind="probe",
        target=workload.model,
        variable=variable,
        values=values,
        find_max=find_max is not None,
        predict=predict,
        db=db,
        workload=workload.model_dump(mode="json"),
        on_point=on_point,
        granularity=FIND_MAX_GRANULARITY.get(variable, 1),
        upper=FIND_MAX_UPPER.get(variable, 1 << 16),
    )


def trial_command(
    argv: list[str],
    *,
    sweep_arg: tuple[str, list[int]] | None = None,
    timeout: float | None = None,
    db: ResultsDB | None = None,
    on_point: PointCallback | None = None,
    on_line: Callable[[str], None] | None = None,
    backend: CommandBackend | None = None,
) -> TrialResult:
    """Run the user's own command (once, or once per --sweep-arg value), sampling its GPU memory."""
    if not argv:
        raise InputError("COMMAND", "nothing to run; put your command after `--`, e.g. -- python train.py")
    flag = sweep_arg[0] if sweep_arg else None
    be = backend or CommandBackend(argv, flag=flag, timeout=timeout, on_line=on_line)
    variable = flag or "run"
    values = sweep_arg[1] if sweep_arg else [1]
    result = run_backend(
        be, kind="command", target=" ".join(argv), variable=variable, values=values, db=db, on_point=on_point
    )
    if sweep_arg is None:
        # a single run has no swept value
        points = [Point(**{**p.__dict__, "values": {}}) for p in result.points]
        return TrialResult(**{**result.__dict__, "points": points, "variable": None})
    return result
