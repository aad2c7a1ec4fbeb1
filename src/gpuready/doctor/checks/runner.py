"""Assembles the checks of every step in order and picks the one cause that stops torch from using the GPU."""

from __future__ import annotations

from gpuready.doctor.checks.base import Check, DoctorFacts, ProbeState
from gpuready.doctor.checks.driver import _driver_checks, _gpu_checks
from gpuready.doctor.checks.packages import _package_checks, _requirement_checks
from gpuready.doctor.checks.runtime import _probe_checks, _visibility_checks
from gpuready.doctor.checks.system import _system_checks
from gpuready.doctor.checks.torch_build import _python_check, _torch_checks

# the causes that stop torch from using the GPU, in the order the doctor names them
CAUSE_ORDER = (
    "nvidia-driver",
    "torch-installed",
    "torch-duplicates",
    "torch-build",
    "torch-driver",
    "torch-arch",
    "cuda-visible-devices",
    "ld-library-path",
    "torch-import",
    "torch-cuda",
    "cuda-libraries",
)


def evaluate(facts: DoctorFacts, state: ProbeState) -> tuple[tuple[Check, ...], Check | None]:
    """All checks in step order, and the one cause (the first failing check in CAUSE_ORDER, else the
    first fail)."""
    probe = state.result
    checks = _driver_checks(facts)
    checks += _gpu_checks(facts)
    torch_checks, build = _torch_checks(facts, probe)
    checks.insert(len(checks), _python_check(facts, build))
    checks += torch_checks
    checks += _visibility_checks(facts, build)
    checks += _probe_checks(facts, state, build)
    checks += _package_checks(facts, build)
    checks += _requirement_checks(facts, build)
    checks += _system_checks(facts)
    # a probe failure that repeats a static cause under the same name keeps the static one first
    fails = [c for c in checks if c.status == "fail"]
    cause = None
    for name in CAUSE_ORDER:
        cause = next((c for c in fails if c.name == name), None)
        if cause is not None:
            break
    if cause is None and fails:
        cause = fails[0]
    return tuple(checks), cause
