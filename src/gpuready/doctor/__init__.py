"""The doctor: is this machine's image ready for a deep-learning job? Checks, the one cause, and the fix.

`doctor()` reads what it can without importing torch (NVML, package metadata, torch/version.py, the tables in
data/) and runs the live torch probe in a child process in parallel. `take_snapshot` / `diff_snapshots` record
and compare environments; `advise_image` picks torch+CUDA variants for a GPU from the tables.
"""

from gpuready.doctor.checks import Check, DoctorFacts, ProbeState, evaluate
from gpuready.doctor.doctor import DoctorReport, doctor, gather_facts
from gpuready.doctor.image import ImageAdvice, advise_image
from gpuready.doctor.snapshot import SnapshotDiff, diff_snapshots, load_snapshot, take_snapshot

__all__ = [
    "Check",
    "DoctorFacts",
    "DoctorReport",
    "ImageAdvice",
    "ProbeState",
    "SnapshotDiff",
    "advise_image",
    "diff_snapshots",
    "doctor",
    "evaluate",
    "gather_facts",
    "load_snapshot",
    "take_snapshot",
]
