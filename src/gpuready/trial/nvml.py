"""The one place gpuready's trial code touches NVML (nvidia-ml-py, imported as `pynvml`).

Everything here answers `None` when NVML, the driver or a metric is missing ("unknown is a value"): a trial
still runs and records torch's own statistics when NVML cannot be read.

Sources: NVML API via nvidia-ml-py's `pynvml.py`; observed values on the H200 in
../shared/reference/environment.md §8 (v1 `used` counts the driver's reserved memory; per-process memory
comes from `nvmlDeviceGetComputeRunningProcesses`, whose PIDs may not match ours inside containers).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class DeviceMemory:
    index: int
    name: str
    total_bytes: int
    used_bytes: int


class NvmlBackend(Protocol):
    """What the sampler needs from NVML; tests inject a fake with the same methods."""

    def device_count(self) -> int: ...

    def memory(self, index: int) -> DeviceMemory | None: ...

    def process_memory(self, index: int) -> dict[int, int]: ...

    def utilization(self, index: int) -> int | None: ...


class Nvml:
    """The real backend. Initialises NVML lazily, once, thread-safely; every query degrades to None/{}."""

    _lock = threading.Lock()
    _ready: bool | None = None

    def _init(self) -> bool:
        with Nvml._lock:
            if Nvml._ready is None:
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    Nvml._ready = True
                except Exception:  # no library, no driver, no permission: all mean "unknown"
                    Nvml._ready = False
            return Nvml._ready

    def _handle(self, index: int) -> Any:
        import pynvml

        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def device_count(self) -> int:
        if not self._init():
            return 0
        import pynvml

        try:
            return int(pynvml.nvmlDeviceGetCount())
        except Exception:
            return 0

    def memory(self, index: int) -> DeviceMemory | None:
        if not self._init():
            return None
        import pynvml

        try:
            handle = self._handle(index)
            try:
                # v2 `used` leaves out the driver's reserved memory (644939776 B on an idle H200), which v1
                # counts; calibration/h200.jsonl's device overhead is v2-based (it matched to the byte)
                info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            except Exception:
                info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode()
            return DeviceMemory(index, str(name), int(info.total), int(info.used))
        except Exception:
            return None

    def process_memory(self, index: int) -> dict[int, int]:
        if not self._init():
            return {}
        import pynvml

        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle(index))
        except Exception:
            return {}
        return {int(p.pid): int(p.usedGpuMemory) for p in procs if p.usedGpuMemory is not None}

    def utilization(self, index: int) -> int | None:
        if not self._init():
            return None
        import pynvml

        try:
            return int(pynvml.nvmlDeviceGetUtilizationRates(self._handle(index)).gpu)
        except Exception:
            return None

    def index_for_uuid(self, uuid: str) -> int | None:
        """NVML index of the GPU with this UUID (CUDA and NVML order GPUs differently; match by UUID)."""
        if not self._init():
            return None
        import pynvml

        want = uuid.lower().removeprefix("gpu-")
        for i in range(self.device_count()):
            try:
                got = pynvml.nvmlDeviceGetUUID(self._handle(i))
            except Exception:
                continue
            if isinstance(got, bytes):
                got = got.decode()
            if str(got).lower().removeprefix("gpu-") == want:
                return i
        return None
