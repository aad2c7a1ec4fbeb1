"""Health readings for `gpuready bench`: clocks, power, temperature and throttle reasons sampled through the run,
volatile ECC counters before and after, and Xid critical-error events as NVML delivers them. Calls:
nvmlDeviceGetClockInfo / GetMaxClockInfo (NVML_CLOCK_SM, MHz), nvmlDeviceGetPowerUsage and
GetEnforcedPowerLimit (milliwatts), nvmlDeviceGetTemperature (NVML_TEMPERATURE_GPU, °C),
nvmlDeviceGetCurrentClocksEventReasons (the bits in THROTTLE_REASONS), nvmlDeviceGetTotalEccErrors
(NVML_VOLATILE_ECC: since the driver loaded), nvmlEventSetCreate + nvmlDeviceRegisterEvents(
nvmlEventTypeXidCriticalError) + nvmlEventSetWait_v2 (eventData is the Xid number), all as named in
nvidia-ml-py's pynvml.py and NVML's API reference (https://docs.nvidia.com/deploy/nvml-api/).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gpuready.nvml.inventory import Nvml, nvml_text


@dataclass(frozen=True)
class GpuReading:
    """One sample of one GPU; every field None where NVML cannot read it."""

    index: int
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_c: int | None = None
    utilization_percent: int | None = None
    memory_used_bytes: int | None = None
    throttle_reasons: int | None = None


@dataclass(frozen=True)
class EccCounts:
    corrected: int | None
    uncorrected: int | None


@dataclass(frozen=True)
class XidEvent:
    index: int | None
    xid: int
    at: float  # time.time() when it was seen


class XidListener(Protocol):
    def wait(self, timeout_seconds: float) -> list[XidEvent]: ...

    def close(self) -> None: ...


class HealthBackend(Protocol):
    """What the bench monitor needs from NVML; tests inject a fake with the same methods."""

    def device_count(self) -> int: ...

    def uuid(self, index: int) -> str | None: ...

    def reading(self, index: int) -> GpuReading: ...

    def ecc_errors(self, index: int) -> EccCounts | None: ...

    def xid_listener(self, indices: list[int]) -> XidListener | None: ...


class _NvmlXidListener:
    def __init__(self, event_set: Any, registered: list[int]) -> None:
        self.event_set = event_set
        self.registered = registered

    def wait(self, timeout_seconds: float) -> list[XidEvent]:
        import time

        import pynvml

        events: list[XidEvent] = []
        try:
            data = pynvml.nvmlEventSetWait_v2(self.event_set, max(1, int(timeout_seconds * 1000)))
        except pynvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing happened
            return events
        index: int | None
        try:
            index = int(pynvml.nvmlDeviceGetIndex(data.device))
        except Exception:
            index = None
        events.append(XidEvent(index, int(data.eventData), time.time()))
        return events

    def close(self) -> None:
        import pynvml

        with contextlib.suppress(Exception):
            pynvml.nvmlEventSetFree(self.event_set)


class NvmlHealth(Nvml):
    """The real health backend (the same lazy NVML start as `Nvml`)."""

    def uuid(self, index: int) -> str | None:
        if not self._init():
            return None
        import pynvml

        try:
            got = pynvml.nvmlDeviceGetUUID(self._handle(index))
        except Exception:
            return None
        return nvml_text(got)

    def reading(self, index: int) -> GpuReading:
        if not self._init():
            return GpuReading(index)
        import pynvml

        try:
            handle = self._handle(index)
        except Exception:
            return GpuReading(index)

        def get(fn_name: str, *args: Any) -> Any:
            fn: Callable[..., Any] | None = getattr(pynvml, fn_name, None)
            if fn is None:
                return None
            try:
                return fn(handle, *args)
            except Exception:
                return None

        power = get("nvmlDeviceGetPowerUsage")
        limit = get("nvmlDeviceGetEnforcedPowerLimit")
        util = get("nvmlDeviceGetUtilizationRates")
        mem = get("nvmlDeviceGetMemoryInfo")
        reasons = get("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:
            reasons = get("nvmlDeviceGetCurrentClocksThrottleReasons")
        clock = get("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM)
        max_clock = get("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM)
        temp = get("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)
        return GpuReading(
            index=index,
            sm_clock_mhz=int(clock) if clock is not None else None,
            max_sm_clock_mhz=int(max_clock) if max_clock is not None else None,
            power_watts=power / 1000.0 if power is not None else None,
            power_limit_watts=limit / 1000.0 if limit is not None else None,
            temperature_c=int(temp) if temp is not None else None,
            utilization_percent=int(util.gpu) if util is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            throttle_reasons=int(reasons) if reasons is not None else None,
        )

    def ecc_errors(self, index: int) -> EccCounts | None:
        if not self._init():
            return None
        import pynvml

        try:
            handle = self._handle(index)
            mode = pynvml.nvmlDeviceGetEccMode(handle)
        except Exception:
            return None
        if not mode or not mode[0]:
            return None  # ECC off or not supported: no counters

        def count(kind: int) -> int | None:
            try:
                return int(pynvml.nvmlDeviceGetTotalEccErrors(handle, kind, pynvml.NVML_VOLATILE_ECC))
            except Exception:
                return None

        return EccCounts(
            count(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED), count(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        )

    def xid_listener(self, indices: list[int]) -> XidListener | None:
        """Listen for Xid critical errors on these GPUs; None where NVML cannot deliver events here."""
        if not self._init():
            return None
        import pynvml

        try:
            event_set = pynvml.nvmlEventSetCreate()
        except Exception:
            return None
        registered = []
        for i in indices:
            try:
                pynvml.nvmlDeviceRegisterEvents(self._handle(i), pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered.append(i)
            except Exception:
                continue
        if not registered:
            with contextlib.suppress(Exception):
                pynvml.nvmlEventSetFree(event_set)
            return None
        return _NvmlXidListener(event_set, registered)
