"""The doctor's own error: what it could not read, told for a person."""

from __future__ import annotations

from gpuready.errors import GpureadyError


class DoctorError(GpureadyError):
    """Something the doctor could not read (NVML, a snapshot file); carries the next step."""
