"""`bench()`: run one fixed job on this machine for a few minutes and record what the platform delivered.

Order of work: read NVML (no GPU: the record says so at once, with the doctor's cause); start the doctor and the
GPU monitor; run the job in a child process (the trial's probe in bench mode, or the user's command) while
reading the steps it announces; stop; test the data disk; add the price; write the record to the results
database. Each foreign thing is reached through its owner: NVML through gpuready/nvml/, processes through
trial/runner.py, torch only in the probe's child. Every dependency is injectable, so all of it runs in tests
without a GPU.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gpuready
from gpuready.bench import stats
from gpuready.bench.disk import DEFAULT_SIZE_BYTES, disk_speed
from gpuready.bench.monitor import GpuMonitor, MonitorData
from gpuready.bench.price import bench_price
from gpuready.bench.ready import reference
from gpuready.bench.record import (
    BenchRecord,
    Disk,
    DoctorVerdict,
    GpuInfo,
    Job,
    Machine,
    Memory,
    Ready,
)
from gpuready.bench.watch import Progress, ProgressFn, Watch, job_indices, watchdog
from gpuready.catalog.prices import Price as CatalogPrice
from gpuready.errors import InputError
from gpuready.nvml import HealthBackend, NvmlReport, read_nvml
from gpuready.store import ResultsDB
from gpuready.trial import runner
from gpuready.trial.backend import _child_env, classify_output, point_from_probe, probe_spec
from gpuready.trial.probe import DEVICE_MARK, STEP_MARK
from gpuready.workload import Workload, describe, make_workload

# The default job: a small LM's full fine-tune (random weights from the preset's config, random tokens from a
# fixed seed). It fits a 24 GiB card (`gpuready estimate llama-3.2-1b --batch 4 --seq 1024 --gpu-memory 24GiB`:
# largest batch 4) and keeps an H200 busy with matmuls rather than kernel launches.
DEFAULT_JOB: dict[str, Any] = {"model": "llama-3.2-1b", "method": "full", "batch": 4, "seq": 1024, "precision": "bf16"}
DEFAULT_SEED = 0
DEFAULT_MINUTES = 5.0
# Loading a model from its config and the first step (CUDA context, cuBLAS autotuning) on top of --minutes.
LOAD_ALLOWANCE_SECONDS = 900.0
# No step for this long once steps were running (and at least 20 median steps): the job is hung.
DEFAULT_HANG_SECONDS = 120.0


def default_workload(**overrides: Any) -> Workload:
    return make_workload(**{**DEFAULT_JOB, **{k: v for k, v in overrides.items() if v is not None}})


def _doctor_verdict(report: Any, seconds: float) -> DoctorVerdict:
    cause = report.cause
    return DoctorVerdict(
        ready=bool(report.ready),
        cause=f"{cause.name}: {cause.detail}" if cause is not None else None,
        failed=[f"{c.name}: {c.detail}" for c in report.checks if c.status == "fail"],
        warned=[f"{c.name}: {c.detail}" for c in report.checks if c.status == "warn"],
        seconds=seconds,
    )


def _run_doctor(run_doctor: Callable[[], Any]) -> DoctorVerdict:
    t0 = time.perf_counter()
    try:
        report = run_doctor()
    except Exception as exc:  # the doctor failing is a finding, not our crash
        return DoctorVerdict(error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0)
    return _doctor_verdict(report, time.perf_counter() - t0)


def _machine(report: NvmlReport, label: str | None, gpus: list[GpuInfo]) -> Machine:
    host = socket.gethostname()
    try:
        import psutil

        memory: int | None = int(psutil.virtual_memory().total)
    except Exception:
        memory = None
    cuda = report.cuda_driver
    return Machine(
        host=host,
        label=label or host,
        cpus=os.cpu_count(),
        memory_bytes=memory,
        driver_version=report.driver_version,
        cuda_driver=f"{cuda[0]}.{cuda[1]}" if cuda else None,
        gpus=gpus,
    )


def bench(
    workload: Workload | None = None,
    *,
    command: list[str] | None = None,
    minutes: float | None = None,
    nproc: int | None = None,
    seed: int = DEFAULT_SEED,
    ordered_at: float | None = None,
    price_per_hour: float | None = None,
    prices: dict[str, CatalogPrice] | None = None,
    disk_path: Path | None = Path("."),
    disk_size_bytes: int = DEFAULT_SIZE_BYTES,
    interval_seconds: float | None = None,
    label: str | None = None,
    timeout: float | None = None,
    hang_seconds: float = DEFAULT_HANG_SECONDS,
    db: ResultsDB | None = None,
    on_progress: ProgressFn | None = None,
    on_line: Callable[[str], None] | None = None,
    nvml_report: Callable[[], NvmlReport] | None = None,
    health: HealthBackend | None = None,
    run: runner.RunFn = runner.run,
    run_doctor: Callable[[], Any] | None = None,
    disk_test: Callable[..., Disk] = disk_speed,
    boot_time: Callable[[], float | None] | None = None,
    init_start: Callable[[], float | None] | None = None,
    clock: Callable[[], float] = time.time,
    sample_seconds: float = 1.0,
) -> BenchRecord:
    """Benchmark this machine on one fixed job and return its record (also written to `db` when given).

    Args:
        workload: the job for the built-in probe (default: DEFAULT_JOB); ignored with `command`.
        command: the user's own command instead (argv); its steps count when it prints `GPUREADY_STEP {json}`
            lines as the probe does, else one run is the unit of work.
        minutes: how long the job runs after its first step (default 5; a command runs to its end unless given).
        nproc: GPUs (torchrun processes) for the probe; > 1 trains with DDP unless the workload shards.
        ordered_at: epoch seconds when the machine was ordered; time to ready counts from it.
        price_per_hour: the price of the GPUs used, per hour; else the catalog's default for this card.
        disk_path: the folder whose disk is tested (None: no disk test).

    Returns:
        BenchRecord. Faults (no GPU, out of memory, a crash, a hung job, Ctrl-C) are its `status`, never raised.

    Raises:
        InputError: bad arguments (minutes ≤ 0, nproc < 1, an --ordered-at after now).
    """
    if minutes is not None and minutes <= 0:
        raise InputError("--minutes", "a number of minutes > 0, e.g. 5 or 0.5")
    if nproc is not None and nproc < 1:
        raise InputError("--nproc", "an integer ≥ 1")
    if command is not None and not command:
        raise InputError("COMMAND", "nothing to run; put your command after `--`")
    started = clock()
    ref = reference(
        ordered_at,
        started,
        **{k: v for k, v in (("boot_time", boot_time), ("init_start", init_start)) if v is not None},
    )
    procs = nproc or 1
    if command is None:
        workload = workload or default_workload()
        if procs > 1 and workload.shard == "none":
            workload = make_workload(**{**workload.model_dump(), "gpus": procs, "shard": "ddp"})
        elif procs > 1:
            workload = make_workload(**{**workload.model_dump(), "gpus": procs})
    duration = minutes if minutes is not None else (None if command else DEFAULT_MINUTES)
    duration_s = duration * 60 if duration is not None else None
    unit = None if command else ("images" if _is_vision(workload) else "tokens")
    job = Job(
        kind="command" if command else "probe",
        description=" ".join(command) if command else describe(workload) if workload else "",
        workload=workload.model_dump(mode="json") if (workload is not None and not command) else None,
        argv=list(command) if command else None,
        nproc=procs,
        seed=None if command else seed,
        unit=unit,
        minutes=duration if duration is not None else 0.0,
    )
    spec: dict[str, Any] | None = None
    if workload is not None and command is None:
        # the job's spec first: a model that cannot be resolved is bad input, before anything starts
        spec = probe_spec(workload)
        spec["bench"] = {"duration_seconds": duration_s or 0.0}
        spec["seed"] = seed
    if on_progress is not None:
        on_progress(Progress("checking"))
    report = (nvml_report or read_nvml)()
    if run_doctor is None:
        from gpuready.doctor import doctor

        def run_doctor() -> Any:
            return doctor()

    errors: list[str] = []
    if not report.available or not report.gpus:
        why = report.error or "NVML lists no GPU"
        verdict = _run_doctor(run_doctor)
        reason = f"no GPU here: {why}" + (f"; the doctor: {verdict.cause}" if verdict.cause else "")
        return _finish(
            db,
            status="no_gpu",
            error=reason,
            errors=[reason],
            machine=_machine(report, label, []),
            job=job,
            ready=Ready(reference=ref.kind, reference_at=ref.at, bench_started_at=started, note=ref.note),
            doctor=verdict,
            steps=[],
            monitor=MonitorData(),
            indices=[],
            interval_seconds=interval_seconds,
            duration_s=duration_s or 0.0,
            unit=unit,
            memory=Memory(),
            disk=None,
            price=bench_price(price_per_hour, None, 0, prices=prices),
            started=started,
            clock=clock,
            sample_seconds=sample_seconds,
        )
    pool = ThreadPoolExecutor(max_workers=1)
    doctor_f: Future[DoctorVerdict] = pool.submit(_run_doctor, run_doctor)
    if health is None:
        from gpuready.nvml import NvmlHealth

        health = NvmlHealth()
    monitor = GpuMonitor(health, interval=sample_seconds, clock=clock)
    monitor.start()
    if on_progress is not None:
        on_progress(Progress("loading", total_seconds=duration_s, unit=unit))
    watch = Watch(duration_s, unit, on_progress, on_line, clock)
    pid_box: list[int] = []
    stop = threading.Event()
    hung: list[str] = []
    dog = threading.Thread(target=watchdog, args=(watch, pid_box, stop, hang_seconds, hung), daemon=True)
    dog.start()
    status, error, memory = "ok", None, Memory()
    tail: list[str] = []
    interrupted = False
    try:
        if command is not None:
            limits = [x for x in (duration_s, timeout) if x is not None]
            proc = run(
                command,
                timeout=min(limits) if limits else None,
                env=None,
                on_line=watch.line,
                on_start=pid_box.append,
            )
            status, error = classify_output(proc.output_tail, proc.returncode, proc.timed_out)
            tail = _tail(proc.output_tail)
            if proc.timed_out and duration_s is not None and (timeout is None or duration_s <= timeout):
                status, error = "ok", None  # stopped at --minutes, as asked
            if not watch.steps and status == "ok":
                # no announced steps: one run of the command is the unit of work
                watch.steps.append(stats.Step(0, 1, clock(), proc.duration_seconds, 1.0))
                job = job.model_copy(update={"unit": "runs"})
                unit = "runs"
        else:
            assert workload is not None
            assert spec is not None
            status, error, memory, tail = _run_probe(spec, nproc, duration_s or 0.0, timeout, run, watch, pid_box)
    except runner.Interrupted:
        interrupted = True
        status, error = "interrupted", "interrupted (Ctrl-C); the steps before it are kept"
    finally:
        stop.set()
        data = monitor.stop()
    if hung:
        status, error = "hung", hung[0]
    if on_progress is not None and not interrupted and disk_path is not None:
        on_progress(Progress("disk"))
    disk = None
    if disk_path is not None and not interrupted:
        try:
            disk = disk_test(disk_path, size_bytes=disk_size_bytes)
        except KeyboardInterrupt:
            # the job's figures are kept; only the disk test is cut short (disk_speed removes its file)
            disk = Disk(path=str(disk_path), error="interrupted (Ctrl-C)")
    verdict = doctor_f.result()
    pool.shutdown()
    if error:
        errors.append(error)
    if verdict.cause:
        errors.append(f"doctor: {verdict.cause}")
    if disk is not None and disk.error:
        errors.append(f"disk: {disk.error}")
    indices = job_indices(watch.uuids, data, procs)
    gpus = [
        GpuInfo(
            index=i,
            name=next((g.name for g in report.gpus if g.index == i), None),
            uuid=data.uuids.get(i),
            memory_total_bytes=next((g.memory_total_bytes for g in report.gpus if g.index == i), None),
        )
        for i in indices
    ]
    first_name = gpus[0].name if gpus else None
    first_total = gpus[0].memory_total_bytes if gpus else None
    first_step = min((s.end for s in watch.steps), default=None) if status != "no_gpu" else None
    ready = Ready(
        reference=ref.kind,
        reference_at=ref.at,
        bench_started_at=started,
        first_step_at=first_step,
        seconds=first_step - ref.at if first_step is not None else None,
        bench_seconds=first_step - started if first_step is not None else None,
        note=ref.note,
    )
    return _finish(
        db,
        status=status,
        error=error,
        errors=errors,
        machine=_machine(report, label, gpus),
        job=job,
        ready=ready,
        doctor=verdict,
        steps=watch.steps,
        monitor=data,
        indices=indices,
        interval_seconds=interval_seconds,
        duration_s=duration_s or 0.0,
        unit=unit,
        memory=memory.model_copy(update={"gpu_total_bytes": memory.gpu_total_bytes or first_total}),
        output_tail=tail if status != "ok" else [],
        disk=disk,
        price=bench_price(price_per_hour, first_name, len(indices), first_total, prices=prices),
        started=started,
        clock=clock,
        sample_seconds=sample_seconds,
    )


def _is_vision(workload: Workload | None) -> bool:
    if workload is None:
        return False
    from gpuready.models import resolve_model

    return resolve_model(workload.model).kind == "vision"


def _run_probe(
    spec: dict[str, Any],
    nproc: int | None,
    duration_s: float,
    timeout: float | None,
    run: runner.RunFn,
    watch: Watch,
    pid_box: list[int],
) -> tuple[str, str | None, Memory, list[str]]:
    with tempfile.TemporaryDirectory(prefix="gpuready-bench-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        out_path = Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        argv = runner.python_module_argv(
            "gpuready.trial.probe", str(spec_path), str(out_path), nproc=nproc if nproc and nproc > 1 else None
        )
        proc = run(
            argv,
            timeout=timeout if timeout is not None else duration_s + LOAD_ALLOWANCE_SECONDS,
            env=_child_env(),
            on_line=watch.line,
            on_start=pid_box.append,
        )
        files = [out_path] if out_path.exists() else sorted(Path(tmp).glob("result.json.rank*"))
        results = [json.loads(f.read_text(encoding="utf-8")) for f in files]
    if not results:
        status, error = classify_output(proc.output_tail, proc.returncode, proc.timed_out)
        if status == "ok":
            status, error = "failed", "the job ended without a result"
        return status, error or "the job ended without a result", Memory(), _tail(proc.output_tail)
    point = point_from_probe({}, results, proc.duration_seconds)
    memory = Memory(
        peak_allocated_bytes=point.peak_allocated_bytes,
        peak_reserved_bytes=point.peak_reserved_bytes,
        peak_device_bytes=point.peak_device_bytes,
        gpu_total_bytes=point.gpu_total_bytes,
    )
    known = ("ok", "oom", "cuda_error", "failed", "unsupported", "no_gpu")
    status = point.status if point.status in known else "failed"
    trace = str(point.detail.get("traceback") or "")
    return status, point.error, memory, (trace.splitlines() or _tail(proc.output_tail)) if status != "ok" else []


TAIL_LINES = 30


def _tail(lines: list[str]) -> list[str]:
    """The job's last output lines, without the step and device lines gpuready reads."""
    own = (STEP_MARK + " ", DEVICE_MARK + " ")
    return [ln for ln in lines if not any(m in ln for m in own)][-TAIL_LINES:]


def _finish(
    db: ResultsDB | None,
    *,
    status: str,
    error: str | None,
    errors: list[str],
    machine: Machine,
    job: Job,
    ready: Ready,
    doctor: DoctorVerdict,
    steps: list[stats.Step],
    monitor: MonitorData,
    indices: list[int],
    interval_seconds: float | None,
    duration_s: float,
    unit: str | None,
    memory: Memory,
    disk: Disk | None,
    price: Any,
    started: float,
    clock: Callable[[], float],
    sample_seconds: float,
    output_tail: list[str] | None = None,
) -> BenchRecord:
    faults = stats.fault_times(monitor.samples, indices, monitor.xid_events)
    interval = stats.interval_seconds_for(duration_s, steps, interval_seconds)
    tp, t0 = stats.throughput(steps, unit=unit, interval_seconds=interval, fault_times=faults)
    last = max((s.end for s in steps), default=None)
    window = (t0, last) if t0 is not None and last is not None and last > t0 else None
    gpu_health = stats.health(
        monitor.samples,
        indices=indices or None,
        window=window,
        sample_seconds=sample_seconds,
        xid_events=monitor.xid_events,
        xid_supported=monitor.xid_supported,
        ecc_new=monitor.ecc_new(indices),
        t0=t0,
    )
    if gpu_health.memory_used_bytes_max is not None:
        memory = memory.model_copy(update={"nvml_used_bytes_max": gpu_health.memory_used_bytes_max})
    for e in gpu_health.xid_events:
        errors.append(f"Xid {e['xid']} on GPU {e['gpu']} at {e['at_seconds']:.0f} s")
    if gpu_health.ecc_uncorrected_new:
        errors.append(f"{gpu_health.ecc_uncorrected_new} new uncorrectable ECC errors")
    if gpu_health.bad_throttle_seconds:
        errors.append(
            f"held back by hardware (power brake, thermal or hardware slowdown) for"
            f" {gpu_health.bad_throttle_seconds:.0f} s"
        )
    record = BenchRecord(
        gpuready_version=gpuready.__version__,
        created_at=dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
        status=status,
        error=error,
        errors=list(dict.fromkeys(errors)),
        machine=machine,
        job=job,
        ready=ready,
        doctor=doctor,
        throughput=tp,
        health=gpu_health,
        memory=memory,
        disk=disk,
        price=price,
        wall_seconds=clock() - started,
        output_tail=output_tail or [],
    )
    if db is not None:
        db.add_bench(record.to_json())
    return record
