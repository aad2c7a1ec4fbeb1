"""nvml.py's health readings over a fake pynvml: units converted, unsupported metrics None, Xid events
delivered with their GPU, a wait that times out is no event."""

from __future__ import annotations

import types
from typing import Any

import pytest

from gpuready import nvml


class NVMLError(Exception):
    pass


class NVMLErrorTimeout(NVMLError):
    pass


def _fake_pynvml(events: list[Any]) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    m.NVML_VOLATILE_ECC = 0  # type: ignore[attr-defined]
    m.NVML_MEMORY_ERROR_TYPE_CORRECTED = 0  # type: ignore[attr-defined]
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1  # type: ignore[attr-defined]
    m.nvmlEventTypeXidCriticalError = 8  # type: ignore[attr-defined]
    calls: dict[str, Any] = {"freed": 0}
    m.calls = calls  # type: ignore[attr-defined]

    def unsupported(*a: Any) -> Any:
        raise NVMLError("Not Supported")

    def wait(event_set: Any, ms: int) -> Any:
        if not events:
            raise NVMLErrorTimeout("Timeout")
        return events.pop(0)

    def free(event_set: Any) -> None:
        calls["freed"] += 1

    funcs = {
        "nvmlInit": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: f"h{i}",
        "nvmlDeviceGetIndex": lambda h: int(h[1:]),
        "nvmlDeviceGetUUID": lambda h: b"GPU-" + h.encode(),
        "nvmlDeviceGetPowerUsage": lambda h: 683307,  # milliwatts
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700000,
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=98, memory=40),
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(total=100, used=42, free=58),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x4,
        "nvmlDeviceGetClockInfo": lambda h, kind: 1897,
        "nvmlDeviceGetMaxClockInfo": lambda h, kind: 1980,
        "nvmlDeviceGetTemperature": unsupported,  # one unreadable metric hides no other
        "nvmlDeviceGetEccMode": lambda h: (1, 1) if h == "h0" else (0, 0),
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 5 if kind == 0 else 0,
        "nvmlEventSetCreate": lambda: "set",
        "nvmlDeviceRegisterEvents": lambda h, types_, s: None if h == "h0" else unsupported(),
        "nvmlEventSetWait_v2": wait,
        "nvmlEventSetFree": free,
    }
    for name, fn in funcs.items():
        setattr(m, name, fn)
    return m


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, list[Any]]:
    events: list[Any] = []
    module = _fake_pynvml(events)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", module)
    monkeypatch.setattr(nvml.Nvml, "_ready", None)
    return module, events


def test_readings_are_in_watts_and_megahertz_and_unknowns_are_none(fake: Any) -> None:
    health = nvml.NvmlHealth()
    r = health.reading(0)
    assert r.power_watts == pytest.approx(683.307) and r.power_limit_watts == 700.0
    assert (r.sm_clock_mhz, r.max_sm_clock_mhz, r.utilization_percent) == (1897, 1980, 98)
    assert r.temperature_c is None and r.throttle_reasons == 0x4 and r.memory_used_bytes == 42
    assert health.uuid(1) == "GPU-h1"
    assert health.ecc_errors(0) == nvml.EccCounts(5, 0)
    assert health.ecc_errors(1) is None  # ECC off: no counters


def test_xid_events_arrive_with_their_gpu_and_a_timeout_is_no_event(fake: Any) -> None:
    module, events = fake
    listener = nvml.NvmlHealth().xid_listener([0, 1])
    assert listener is not None
    assert listener.wait(0.01) == []
    events.append(types.SimpleNamespace(device="h0", eventData=79, eventType=8))
    got = listener.wait(0.01)
    assert [(e.index, e.xid) for e in got] == [(0, 79)]
    listener.close()
    assert module.calls["freed"] == 1
