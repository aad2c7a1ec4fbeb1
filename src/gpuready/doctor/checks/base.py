"""What every check module shares: the `Check` record, the facts and probe state the checks read, and the
helpers several steps use (the GPUs' capabilities, the driver and Python versions, the torch install command)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from gpuready.doctor.advice import best_variant, install_command, newest_release_with
from gpuready.doctor.packages import PackageScan
from gpuready.doctor.probe import CommandResult, ProbeResult
from gpuready.doctor.requirements import RequirementsFile
from gpuready.doctor.system import SystemInfo, kernel_driver_version
from gpuready.doctor.tables import Capability, torch_release
from gpuready.nvml import NvmlReport

Status = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None
    step: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DoctorFacts:
    """Everything read without importing torch."""

    nvml: NvmlReport
    packages: PackageScan
    system: SystemInfo
    requirements: RequirementsFile | None = None
    nvcc_version: str | None = None
    pip_check: CommandResult | None = None
    own_pids: tuple[int, ...] = ()  # the doctor's own children (the probe): not "other processes"


@dataclass(frozen=True)
class ProbeState:
    """What happened to the live probe: its result, or why there is none."""

    result: ProbeResult | None = None
    skipped: str | None = None  # "--fast", "no NVIDIA driver", "pending"


def _capabilities(facts: DoctorFacts) -> list[Capability]:
    return [g.compute_capability for g in facts.nvml.gpus if g.compute_capability is not None]


def _driver(facts: DoctorFacts) -> str | None:
    return facts.nvml.driver_version or kernel_driver_version(facts.system.kernel_driver)


def _python(facts: DoctorFacts) -> tuple[int, int] | None:
    parts = facts.system.python_version.split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else None


def _torch_fix(facts: DoctorFacts, version: str | None) -> str | None:
    """The install command for torch (this version if the table knows a variant for it) that suits this
    machine."""
    caps = _capabilities(facts)
    release = torch_release(version) if version else None
    option = best_variant(release, facts.nvml.cuda_driver, _driver(facts), caps, _python(facts)) if release else None
    if option is not None and option.covers_gpus is not False:
        return install_command(option.row, version)
    newest = newest_release_with(facts.nvml.cuda_driver, _driver(facts), caps, _python(facts))
    if newest is None:
        return None
    return install_command(newest.row, None)
