"""The one package that touches NVML (nvidia-ml-py, imported as `pynvml`): the inventory the doctor reads
(`read_nvml`) and the live readings the trial samples (`Nvml`) in inventory.py; the health readings `gpuready bench`
samples (`NvmlHealth`: clocks, power, temperature, throttle reasons, ECC counters, Xid events) in health.py.

Every reading is optional: a metric NVML does not support on this GPU or driver ("NotSupported",
"FunctionNotFound", a function missing from an old pynvml) becomes None, and one unreadable metric never hides
the others (unknown is a value). Failures to start NVML at all become an `NvmlReport` that says why.
Calls and their meaning: ../shared/reference/environment.md §8.
"""

from gpuready.nvml.health import (
    EccCounts,
    GpuReading,
    HealthBackend,
    NvmlHealth,
    XidEvent,
    XidListener,
)
from gpuready.nvml.inventory import (
    BAD_THROTTLE_MASK,
    THROTTLE_REASONS,
    DeviceMemory,
    GpuProcess,
    Nvml,
    NvmlBackend,
    NvmlErrorKind,
    NvmlGpu,
    NvmlReport,
    RemappedRows,
    read_nvml,
    throttle_names,
)

__all__ = [
    "BAD_THROTTLE_MASK",
    "THROTTLE_REASONS",
    "DeviceMemory",
    "EccCounts",
    "GpuProcess",
    "GpuReading",
    "HealthBackend",
    "Nvml",
    "NvmlBackend",
    "NvmlErrorKind",
    "NvmlGpu",
    "NvmlHealth",
    "NvmlReport",
    "RemappedRows",
    "XidEvent",
    "XidListener",
    "read_nvml",
    "throttle_names",
]
