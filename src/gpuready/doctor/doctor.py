"""`doctor()`: is this machine's image ready for the job? The verdict from files first, the live probe
in parallel.

Order of work: start the torch probe (a child process) and `pip check` at once; meanwhile read NVML, package
metadata, torch's version file and the system (well under a second); hand that static report to `on_static`;
then wait for the probe and return the final report. Without a driver the probe is dropped: torch cannot use
a GPU that is not there, and the answer should come at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuready.doctor.checks import Check, DoctorFacts, ProbeState, evaluate
from gpuready.doctor.packages import PackageScan, scan_packages
from gpuready.doctor.probe import (
    DEFAULT_PROBE_TIMEOUT_SECONDS,
    PendingProbe,
    RunningCommand,
    TorchProbe,
    nvcc_version,
    pip_check,
)
from gpuready.doctor.requirements import RequirementsFile, find_requirements, read_requirements
from gpuready.doctor.system import SystemInfo, read_system
from gpuready.nvml import NvmlReport, read_nvml


@dataclass(frozen=True)
class DoctorReport:
    ready: bool
    checks: tuple[Check, ...]
    cause: Check | None
    final: bool  # False for the early report shown before the probe answers
    probe: str  # "ran", "skipped: --fast", "skipped: no NVIDIA driver", "pending"
    static_seconds: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "checks": [c.to_dict() for c in self.checks],
            "cause": self.cause.to_dict() if self.cause else None,
            "probe": self.probe,
            "static_seconds": round(self.static_seconds, 3),
            "seconds": round(self.seconds, 3),
        }


def gather_facts(
    requirements: Path | None = None,
    *,
    cwd: Path | None = None,
    nvml_lib: Any = None,
    env: Mapping[str, str] | None = None,
    read_nvml_fn: Callable[[Any], NvmlReport] = read_nvml,
    scan_fn: Callable[[], PackageScan] = scan_packages,
    system_fn: Callable[[Mapping[str, str] | None], SystemInfo] = read_system,
    pip_check_result: RunningCommand | None = None,
    own_pids: tuple[int, ...] = (),
) -> DoctorFacts:
    """Everything the doctor reads without importing torch. Sources run side by side in threads."""
    req_path = requirements or find_requirements(cwd or Path.cwd())
    reqs: RequirementsFile | None = read_requirements(req_path) if req_path else None
    with ThreadPoolExecutor(max_workers=3) as pool:
        nvml_f = pool.submit(read_nvml_fn, nvml_lib)
        system_f = pool.submit(system_fn, env)
        scan = scan_fn()
        system = system_f.result()
        # `nvcc --version` is a child process: wait for it alongside NVML rather than after
        nvcc_f = pool.submit(nvcc_version, system.nvcc) if system.nvcc else None
        nvml = nvml_f.result()
        nvcc = nvcc_f.result() if nvcc_f is not None else None
    return DoctorFacts(
        nvml=nvml,
        packages=scan,
        system=system,
        requirements=reqs,
        nvcc_version=nvcc,
        own_pids=own_pids,
        pip_check=pip_check_result.wait() if pip_check_result is not None else None,
    )


def _report(facts: DoctorFacts, state: ProbeState, probe: str, final: bool, t0: float, static: float) -> DoctorReport:
    checks, cause = evaluate(facts, state)
    return DoctorReport(
        ready=not any(c.status == "fail" for c in checks),
        checks=checks,
        cause=cause,
        final=final,
        probe=probe,
        static_seconds=static,
        seconds=time.perf_counter() - t0,
    )


def doctor(
    requirements: Path | None = None,
    fast: bool = False,
    *,
    cwd: Path | None = None,
    on_static: Callable[[DoctorReport], None] | None = None,
    start_probe: Callable[[], PendingProbe] | None = None,
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT_SECONDS,
    run_pip_check: bool = True,
    facts_fn: Callable[..., DoctorFacts] = gather_facts,
    **facts_kwargs: Any,
) -> DoctorReport:
    """Check the machine; `on_static` receives the verdict from files before the live probe is waited for.

    `start_probe` (a fake in tests) starts the torch probe; by default `python -c <probe>` with
    `probe_timeout`.
    `--fast` skips the probe and `pip check`."""
    t0 = time.perf_counter()
    pending: PendingProbe | None = None
    pip: RunningCommand | None = None
    if not fast:
        pending = start_probe() if start_probe is not None else TorchProbe(timeout=probe_timeout)
        if run_pip_check:
            pip = pip_check()
    own = tuple(pid for pid in (getattr(pending, "pid", None), pip.pid if pip else None) if pid is not None)
    facts = facts_fn(requirements, cwd=cwd, own_pids=own, **facts_kwargs)
    static_seconds = time.perf_counter() - t0
    if fast or pending is None:
        return _report(facts, ProbeState(skipped="--fast"), "skipped: --fast", True, t0, static_seconds)
    no_gpu = facts.nvml.error is not None or not facts.nvml.gpus
    if no_gpu:
        pending.cancel()
        if pip is not None:
            pip.cancel()
        reason = "no NVIDIA driver or GPU, so torch cannot use one"
        return _report(facts, ProbeState(skipped=reason), f"skipped: {reason}", True, t0, static_seconds)
    if on_static is not None:
        on_static(_report(facts, ProbeState(skipped="pending"), "pending", False, t0, static_seconds))
    result = pending.result()
    if pip is not None:
        facts = DoctorFacts(**{**facts.__dict__, "pip_check": pip.wait()})
    return _report(facts, ProbeState(result=result), "ran", True, t0, static_seconds)
