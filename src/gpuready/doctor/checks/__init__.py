"""From facts to checks: each `{name, status, detail, fix}`, grouped by step, and the one cause when torch
cannot use the GPU. Pure functions of the facts and the probe result, so every diagnosis is testable on a CPU.
Failure causes and their evidence: ../shared/reference/environment.md §5-§6.

The package splits the checks by step: `base` (the `Check` record, the facts, shared helpers), `driver` (driver
and GPUs), `torch_build` (Python and the torch build), `runtime` (what CUDA will see, the live probe),
`packages` (packages and requirements), `system` (disks, memory, services) and `runner` (`evaluate`).
"""

from gpuready.doctor.checks.base import Check, DoctorFacts, ProbeState, Status
from gpuready.doctor.checks.runner import CAUSE_ORDER, evaluate
from gpuready.doctor.checks.system import LOW_DISK_BYTES, LOW_SHM_BYTES

__all__ = [
    "CAUSE_ORDER",
    "LOW_DISK_BYTES",
    "LOW_SHM_BYTES",
    "Check",
    "DoctorFacts",
    "ProbeState",
    "Status",
    "evaluate",
]
