"""Sample GPU memory and utilization of a process tree at ≥ 10 Hz while the user's command runs.

NVML is read through gpuready/nvml/ (an injected backend); the process tree through psutil. NVML lists per-process
memory by PID; inside containers those PIDs may be the host's and match nothing here, so when no PID of the
tree is ever seen the peak falls back to the device's used memory minus what was used before the start
(`source` says which one a summary holds).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuready.nvml import Nvml, NvmlBackend

DEFAULT_INTERVAL_SECONDS = 0.05  # 20 Hz; the issue asks for at least 10 Hz


def process_tree(pid: int) -> set[int]:
    """pid and all its descendants (gone processes are simply absent)."""
    import psutil  # type: ignore[import-untyped,unused-ignore]

    try:
        proc = psutil.Process(pid)
        return {pid, *(c.pid for c in proc.children(recursive=True))}
    except psutil.Error:
        return {pid}


@dataclass(frozen=True)
class SamplerSummary:
    samples: int
    rate_hz: float | None
    peak_bytes: int | None  # per GPU, the largest of the GPUs the tree used
    source: str  # "process" (NVML per-PID), "device" (used − baseline), or "none"
    peak_utilization: int | None
    mean_utilization: float | None
    gpu: str | None
    total_bytes: int | None
    sample_cost_seconds: float | None  # mean time one sample took (the sampler's own cost)


class Sampler:
    """Background thread: `start_baseline()` before the child starts, `start(pid)`, then `stop()`."""

    def __init__(
        self,
        nvml: NvmlBackend | None = None,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        tree: Callable[[int], set[int]] = process_tree,
    ) -> None:
        self.nvml: NvmlBackend = nvml if nvml is not None else Nvml()
        self.interval = interval
        self.tree = tree
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._baseline: dict[int, int] = {}
        self._proc_peak: dict[int, int] = {}
        self._dev_peak: dict[int, int] = {}
        self._util: list[int] = []
        self._costs: list[float] = []
        self._started = 0.0
        self._ended = 0.0
        self._devices = 0
        self._gpu: str | None = None
        self._total: int | None = None

    def start_baseline(self) -> None:
        self._devices = self.nvml.device_count()
        for i in range(self._devices):
            mem = self.nvml.memory(i)
            if mem is not None:
                self._baseline[i] = mem.used_bytes
                self._gpu = self._gpu or mem.name
                self._total = self._total or mem.total_bytes

    def start(self, pid: int) -> None:
        if not self._devices:
            self.start_baseline()
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, args=(pid,), daemon=True, name="gpuready-sampler")
        self._thread.start()

    def sample_once(self, pid: int) -> None:
        t0 = time.perf_counter()
        pids = self.tree(pid)
        utils: list[int] = []
        for i in range(self._devices):
            procs = self.nvml.process_memory(i)
            mine = sum(b for p, b in procs.items() if p in pids)
            if mine:
                self._proc_peak[i] = max(self._proc_peak.get(i, 0), mine)
            mem = self.nvml.memory(i)
            if mem is not None and i in self._baseline:
                self._dev_peak[i] = max(self._dev_peak.get(i, 0), mem.used_bytes - self._baseline[i])
            util = self.nvml.utilization(i)
            if util is not None:
                utils.append(util)
        if utils:
            self._util.append(max(utils))
        self._costs.append(time.perf_counter() - t0)

    def _loop(self, pid: int) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            self.sample_once(pid)
            next_at += self.interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_at = time.perf_counter()

    def stop(self) -> SamplerSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._ended = time.perf_counter()
        return self.summary()

    def summary(self) -> SamplerSummary:
        n = len(self._costs)
        span = (self._ended or time.perf_counter()) - self._started if self._started else 0.0
        if self._proc_peak:
            peak: int | None = max(self._proc_peak.values())
            source = "process"
        elif self._dev_peak:
            peak = max(0, max(self._dev_peak.values()))
            source = "device"
        else:
            peak, source = None, "none"
        return SamplerSummary(
            samples=n,
            rate_hz=n / span if span > 0 and n else None,
            peak_bytes=peak,
            source=source,
            peak_utilization=max(self._util) if self._util else None,
            mean_utilization=statistics.fmean(self._util) if self._util else None,
            gpu=self._gpu,
            total_bytes=self._total,
            sample_cost_seconds=statistics.fmean(self._costs) if self._costs else None,
        )
