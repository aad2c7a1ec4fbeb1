"""NVML's inventory the doctor reads (`read_nvml`) and the live readings the trial samples (`Nvml`). How a reading
that fails is reported: the package's docstring (nvml/__init__.py). Calls and their meaning:
../shared/reference/environment.md §8.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

T = TypeVar("T")

NvmlErrorKind = Literal["pynvml_missing", "library_not_found", "driver_not_loaded", "no_permission", "other"]

# clocks event (throttle) reason bits, nvidia-ml-py pynvml.py nvmlClocksEventReason*
THROTTLE_REASONS = {
    0x1: "idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}
# reasons that mean the GPU is being held back by something wrong (power, heat, hardware)
BAD_THROTTLE_MASK = 0x8 | 0x40 | 0x80


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    processes: tuple[GpuProcess, ...] | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    remapped_rows: RemappedRows | None = None
    throttle_reasons: int | None = None
    mig_enabled: bool | None = None
    persistence_enabled: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None


@dataclass(frozen=True)
class NvmlReport:
    """What NVML says about the driver and each GPU. `error` is set when NVML could not start."""

    driver_version: str | None = None
    cuda_driver_version: int | None = None  # major*1000 + minor*10, e.g. 12020 = CUDA 12.2
    gpus: tuple[NvmlGpu, ...] = ()
    error: str | None = None
    error_kind: NvmlErrorKind | None = None

    @property
    def available(self) -> bool:
        return self.error is None

    @property
    def cuda_driver(self) -> tuple[int, int] | None:
        if self.cuda_driver_version is None:
            return None
        return self.cuda_driver_version // 1000, (self.cuda_driver_version % 1000) // 10


def nvml_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_kind(lib: Any, exc: Exception) -> NvmlErrorKind:
    value = getattr(exc, "value", None)
    kinds: dict[str, NvmlErrorKind] = {
        "NVML_ERROR_LIBRARY_NOT_FOUND": "library_not_found",
        "NVML_ERROR_DRIVER_NOT_LOADED": "driver_not_loaded",
        "NVML_ERROR_NO_PERMISSION": "no_permission",
    }
    for const, kind in kinds.items():
        if value is not None and value == getattr(lib, const, object()):
            return kind
    return "other"


def read_nvml(lib: Any = None) -> NvmlReport:
    """Read driver and GPUs through NVML. `lib` is the pynvml module or a fake with the same functions."""
    if lib is None:
        try:
            import pynvml

            lib = pynvml
        except ImportError as exc:
            return NvmlReport(error=f"nvidia-ml-py is not installed ({exc})", error_kind="pynvml_missing")
    nvml_error: type[Exception] = lib.NVMLError
    try:
        lib.nvmlInit()
    except nvml_error as exc:
        return NvmlReport(error=f"NVML: {exc}", error_kind=_error_kind(lib, exc))
    except OSError as exc:  # some pynvml versions let the dlopen failure through
        return NvmlReport(error=f"NVML: {exc}", error_kind="library_not_found")
    try:

        def get(fn_name: str, *args: Any) -> Any:
            fn: Callable[..., Any] | None = getattr(lib, fn_name, None)
            if fn is None:
                return None
            try:
                return fn(*args)
            except nvml_error:
                return None

        driver = get("nvmlSystemGetDriverVersion")
        cuda = get("nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = get("nvmlSystemGetCudaDriverVersion")
        count = get("nvmlDeviceGetCount")
        gpus = tuple(_read_gpu(lib, get, i) for i in range(int(count or 0)))
        return NvmlReport(
            driver_version=nvml_text(driver) if driver is not None else None,
            cuda_driver_version=int(cuda) if cuda is not None else None,
            gpus=gpus,
        )
    finally:
        with contextlib.suppress(nvml_error):
            lib.nvmlShutdown()


def _read_gpu(lib: Any, get: Callable[..., Any], index: int) -> NvmlGpu:
    handle = get("nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return NvmlGpu(index=index)
    name = get("nvmlDeviceGetName", handle)
    uuid = get("nvmlDeviceGetUUID", handle)
    pci = get("nvmlDeviceGetPciInfo", handle)
    mem = get("nvmlDeviceGetMemoryInfo", handle)
    cc = get("nvmlDeviceGetCudaComputeCapability", handle)
    procs = get("nvmlDeviceGetComputeRunningProcesses", handle)
    ecc_mode = get("nvmlDeviceGetEccMode", handle)
    corrected = uncorrected = None
    if ecc_mode is not None and ecc_mode[0]:
        corrected = get(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            getattr(lib, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
            getattr(lib, "NVML_VOLATILE_ECC", 0),
        )
        uncorrected = get(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            getattr(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            getattr(lib, "NVML_VOLATILE_ECC", 0),
        )
    rows = get("nvmlDeviceGetRemappedRows", handle)
    throttle = get("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if throttle is None:
        throttle = get("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    mig = get("nvmlDeviceGetMigMode", handle)
    persistence = get("nvmlDeviceGetPersistenceMode", handle)
    return NvmlGpu(
        index=index,
        name=nvml_text(name) if name is not None else None,
        uuid=nvml_text(uuid) if uuid is not None else None,
        pci_bus_id=nvml_text(getattr(pci, "busId", "")) or None if pci is not None else None,
        memory_total_bytes=int(mem.total) if mem is not None else None,
        memory_used_bytes=int(mem.used) if mem is not None else None,
        memory_free_bytes=int(mem.free) if mem is not None else None,
        compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
        processes=(
            tuple(GpuProcess(int(p.pid), getattr(p, "usedGpuMemory", None)) for p in procs)
            if procs is not None
            else None
        ),
        ecc_enabled=bool(ecc_mode[0]) if ecc_mode is not None else None,
        ecc_corrected_volatile=int(corrected) if corrected is not None else None,
        ecc_uncorrected_volatile=int(uncorrected) if uncorrected is not None else None,
        remapped_rows=(
            RemappedRows(int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3])) if rows is not None else None
        ),
        throttle_reasons=int(throttle) if throttle is not None else None,
        mig_enabled=bool(mig[0]) if mig is not None else None,
        persistence_enabled=bool(persistence) if persistence is not None else None,
        pcie_gen=get("nvmlDeviceGetCurrPcieLinkGeneration", handle),
        pcie_gen_max=get("nvmlDeviceGetMaxPcieLinkGeneration", handle),
        pcie_width=get("nvmlDeviceGetCurrPcieLinkWidth", handle),
        pcie_width_max=get("nvmlDeviceGetMaxPcieLinkWidth", handle),
    )


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


# ---------------------------------------------------------------------------------------------------------
# Live readings for the trial's sampler and probe. Sources: environment.md §8 (v1 `used` counts the driver's
# reserved memory; per-process memory comes from nvmlDeviceGetComputeRunningProcesses, whose PIDs may not
# match ours inside containers).


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
