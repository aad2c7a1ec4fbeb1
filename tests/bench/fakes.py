"""Fakes for bench: NVML (inventory and health), the doctor, and the probe child (its step lines and result)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuready.nvml import EccCounts, GpuReading, NvmlGpu, NvmlReport, XidEvent
from gpuready.trial import runner
from gpuready.trial.probe import DEVICE_MARK, STEP_MARK

H200_BYTES = 143771 * 2**20


def report(gpus: int = 1, name: str = "NVIDIA H200") -> NvmlReport:
    return NvmlReport(
        driver_version="580.65.06",
        cuda_driver_version=13000,
        gpus=tuple(
            NvmlGpu(index=i, name=name, uuid=f"GPU-{i:04d}", memory_total_bytes=H200_BYTES) for i in range(gpus)
        ),
    )


def no_gpu_report() -> NvmlReport:
    return NvmlReport(error="NVML: Driver Not Loaded", error_kind="driver_not_loaded")


@dataclass
class FakeXid:
    events: list[XidEvent]
    closed: bool = False

    def wait(self, timeout_seconds: float) -> list[XidEvent]:
        if self.events:
            out, self.events = self.events, []
            return out
        time.sleep(min(timeout_seconds, 0.01))
        return []

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeHealth:
    gpus: int = 1
    reading_fn: Callable[[int], GpuReading] | None = None
    ecc: list[EccCounts] = field(default_factory=lambda: [EccCounts(0, 0), EccCounts(0, 0)])
    xids: list[XidEvent] = field(default_factory=list)
    ecc_calls: int = 0

    def device_count(self) -> int:
        return self.gpus

    def uuid(self, index: int) -> str | None:
        return f"GPU-{index:04d}"

    def reading(self, index: int) -> GpuReading:
        if self.reading_fn is not None:
            return self.reading_fn(index)
        return GpuReading(
            index=index,
            sm_clock_mhz=1980,
            max_sm_clock_mhz=1980,
            power_watts=650.0,
            power_limit_watts=700.0,
            temperature_c=60,
            utilization_percent=100,
            memory_used_bytes=30 * 2**30,
            throttle_reasons=0,
        )

    def ecc_errors(self, index: int) -> EccCounts | None:
        self.ecc_calls += 1
        # first `gpus` calls are the start, the rest the end
        return self.ecc[0] if self.ecc_calls <= self.gpus else self.ecc[-1]

    def xid_listener(self, indices: list[int]) -> FakeXid | None:
        return FakeXid(list(self.xids))


@dataclass
class FakeDoctor:
    ready: bool = True
    cause: Any = None
    checks: tuple[Any, ...] = ()


@dataclass(frozen=True)
class FakeCheck:
    name: str
    status: str
    detail: str
    fix: str | None = None


def probe_run(
    *,
    ranks: int = 1,
    steps: int = 61,
    step_seconds: float = 0.1,
    units: int = 4096,
    slow: dict[int, float] | None = None,
    result: dict[str, Any] | None = None,
    write_result: bool = True,
    returncode: int | None = 0,
    tail: list[str] | None = None,
    seen: dict[str, Any] | None = None,
) -> runner.RunFn:
    """A probe child: announces its device and `steps` steps per rank (`slow`: step -> seconds), then writes
    its result file(s)."""

    def run(argv: list[str], **kwargs: Any) -> runner.ProcessResult:
        on_line = kwargs.get("on_line")
        if seen is not None:
            seen["argv"] = list(argv)
            seen["spec"] = json.loads(Path(argv[-2]).read_text())
            seen["timeout"] = kwargs.get("timeout")
        start = time.time() - steps * step_seconds - 5
        for rank in range(ranks):
            if on_line:
                on_line(f"{DEVICE_MARK} " + json.dumps({"rank": rank, "uuid": f"{rank:04d}", "name": "NVIDIA H200"}))
                on_line("some warning from transformers")
        for rank in range(ranks):
            t = start
            for n in range(1, steps + 1):
                secs = (slow or {}).get(n, step_seconds)
                t += secs
                if on_line:
                    line = {"rank": rank, "step": n, "end": t, "seconds": secs, "units": units}
                    on_line(f"[rank{rank}]:{STEP_MARK} " + json.dumps(line))
        if write_result:
            out = Path(argv[-1])
            for rank in range(ranks):
                data = {
                    "ok": True,
                    "rank": rank,
                    "peak_allocated_bytes": 20 * 2**30,
                    "peak_reserved_bytes": 22 * 2**30,
                    "peak_device_bytes": 23 * 2**30,
                    "gpu": "NVIDIA H200",
                    "gpu_total_bytes": H200_BYTES,
                    "step_seconds": step_seconds,
                    **(result or {}),
                }
                target = out if ranks == 1 else out.with_name(f"{out.name}.rank{rank}")
                target.write_text(json.dumps(data))
        return runner.ProcessResult(list(argv), returncode, 7.0, output_tail=tail or [])

    return run


def record_file(tmp_path: Path, name: str, *, step_seconds: float, price: float, **kwargs: Any) -> Path:
    """A bench record made by bench() with these fakes, written to tmp_path/NAME.json. The machine booted a
    minute before (not this test machine's real boot, which moves with its uptime)."""
    from gpuready.bench import bench
    from gpuready.bench.record import Disk

    booted = time.time() - 60.0
    kwargs.setdefault("boot_time", lambda: booted)
    kwargs.setdefault("init_start", lambda: booted)

    rec = bench(
        minutes=kwargs.pop("minutes", 0.1),
        interval_seconds=kwargs.pop("interval_seconds", 1.0),
        nvml_report=fakes_report(kwargs.pop("gpus", 1)),
        health=FakeHealth(),
        run=kwargs.pop("run", None) or probe_run(step_seconds=step_seconds, slow=kwargs.pop("slow", None)),
        run_doctor=FakeDoctor,
        disk_test=lambda p, **k: Disk(path=str(p), write_bytes_per_second=1.2e9, read_bytes_per_second=2.5e9),
        label=name,
        price_per_hour=price,
        sample_seconds=0.02,
        **kwargs,
    )
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(rec.to_json()))
    return path


def fakes_report(gpus: int) -> Callable[[], NvmlReport]:
    return lambda: report(gpus)
