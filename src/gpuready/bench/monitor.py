"""Watch the GPUs while the bench job runs: a sample of every GPU each second, Xid events as NVML sends them,
ECC counters at the start and the end. NVML only through gpuready/nvml/ (an injected backend)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuready.bench.stats import Sample
from gpuready.nvml import EccCounts, HealthBackend, XidEvent, XidListener

DEFAULT_SAMPLE_SECONDS = 1.0


@dataclass
class MonitorData:
    samples: list[Sample] = field(default_factory=list)
    xid_events: list[XidEvent] = field(default_factory=list)
    xid_supported: bool = False
    ecc_before: dict[int, EccCounts | None] = field(default_factory=dict)
    ecc_after: dict[int, EccCounts | None] = field(default_factory=dict)
    uuids: dict[int, str] = field(default_factory=dict)  # NVML index -> UUID

    def ecc_new(self, indices: list[int]) -> tuple[int | None, int | None]:
        """New corrected and uncorrected ECC errors on these GPUs during the run (None: unreadable)."""

        def delta(attr: str) -> int | None:
            total, known = 0, False
            for i in indices:
                a, b = self.ecc_before.get(i), self.ecc_after.get(i)
                va, vb = getattr(a, attr, None), getattr(b, attr, None)
                if va is not None and vb is not None:
                    total += max(0, int(vb) - int(va))
                    known = True
            return total if known else None

        return delta("corrected"), delta("uncorrected")


class GpuMonitor:
    """`start()`, then `stop()` returns what was seen. Every GPU NVML lists is watched; the record keeps the
    job's own (matched by UUID)."""

    def __init__(
        self,
        nvml: HealthBackend,
        interval: float = DEFAULT_SAMPLE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.interval = interval
        self.clock = clock
        self.data = MonitorData()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listener: XidListener | None = None
        self._count = 0

    def start(self) -> None:
        self._count = self.nvml.device_count()
        indices = list(range(self._count))
        for i in indices:
            uuid = self.nvml.uuid(i)
            if uuid:
                self.data.uuids[i] = uuid
            self.data.ecc_before[i] = self.nvml.ecc_errors(i)
        self._listener = self.nvml.xid_listener(indices) if indices else None
        self.data.xid_supported = self._listener is not None
        self._threads = [threading.Thread(target=self._sample_loop, daemon=True)]
        if self._listener is not None:
            self._threads.append(threading.Thread(target=self._xid_loop, daemon=True))
        for t in self._threads:
            t.start()

    def sample_once(self) -> None:
        now = self.clock()
        for i in range(self._count):
            self.data.samples.append(Sample(now, self.nvml.reading(i)))

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    def _xid_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            self.data.xid_events.extend(self._listener.wait(0.5))

    def stop(self) -> MonitorData:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
        for i in range(self._count):
            self.data.ecc_after[i] = self.nvml.ecc_errors(i)
        return self.data
