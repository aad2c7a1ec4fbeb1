"""The benchmark job's stream as `bench()` (bench/run.py) reads it: the steps and devices the probe announces, the
progress they make, the watchdog that ends a job whose steps stop, and which GPUs the job used."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuready.bench import stats
from gpuready.bench.monitor import MonitorData
from gpuready.trial.probe import DEVICE_MARK, STEP_MARK


@dataclass
class Progress:
    """What the CLI's progress bar shows: the phase and, while the job runs, how far it is."""

    phase: str  # "checking", "loading", "running", "disk", "done"
    elapsed_seconds: float = 0.0  # since the first step ended (running)
    total_seconds: float | None = None
    steps: int = 0
    per_second: float | None = None  # the last step's throughput (all ranks' units / its seconds)
    unit: str | None = None


ProgressFn = Callable[[Progress], None]


@dataclass
class Watch:
    """The job's stream, read line by line: steps, devices, and when the last step arrived."""

    duration: float | None
    unit: str | None
    on_progress: ProgressFn | None
    on_line: Callable[[str], None] | None
    clock: Callable[[], float]
    steps: list[stats.Step] = field(default_factory=list)
    uuids: dict[int, str] = field(default_factory=dict)
    last_step_at: float | None = None
    first_end: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def line(self, text: str) -> None:
        for mark in (STEP_MARK, DEVICE_MARK):
            at = text.find(mark + " ")
            if at >= 0:
                try:
                    data = json.loads(text[at + len(mark) + 1 :])
                except ValueError:
                    break
                if mark == DEVICE_MARK and isinstance(data, dict):
                    self.uuids[int(data.get("rank", 0))] = str(data.get("uuid") or "")
                elif isinstance(data, dict):
                    self._step(data)
                return
        if self.on_line is not None:
            self.on_line(text)

    def _step(self, data: dict[str, Any]) -> None:
        step = stats.parse_step(data)
        if step is None:
            return
        with self.lock:
            self.steps.append(step)
            self.last_step_at = self.clock()
            if self.first_end is None:
                self.first_end = step.end
        if self.on_progress is not None:
            self.on_progress(
                Progress(
                    "running",
                    elapsed_seconds=max(0.0, step.end - self.first_end),
                    total_seconds=self.duration,
                    steps=len(self.steps),
                    per_second=step.units / step.seconds if step.seconds > 0 else None,
                    unit=self.unit,
                )
            )


def median_step(steps: list[stats.Step]) -> float | None:
    later = sorted(s.seconds for s in steps if s.step > 1)
    return later[len(later) // 2] if later else None


def watchdog(watch: Watch, pid_box: list[int], stop: threading.Event, hang_seconds: float, hung: list[str]) -> None:
    """End the job when its steps stop: no step for max(hang_seconds, 20 median steps) after steps began."""
    from gpuready.process import kill_group

    while not stop.wait(1.0):
        with watch.lock:
            last = watch.last_step_at
            med = median_step(watch.steps)
        if last is None or not pid_box:
            continue
        limit = max(hang_seconds, 20 * (med or 0.0))
        if watch.clock() - last > limit:
            hung.append(f"no GPU step finished for {limit:.0f} s after {len(watch.steps)} steps: the job hung")
            kill_group(pid_box[0])
            return


def visible_indices() -> list[int] | None:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None or not cvd.strip():
        return None
    parts = [p.strip() for p in cvd.split(",") if p.strip()]
    return [int(p) for p in parts] if all(p.isdigit() for p in parts) else None


def job_indices(uuids_by_rank: dict[int, str], monitor: MonitorData, nproc: int) -> list[int]:
    """NVML indices of the GPUs the job used: matched by UUID (CUDA and NVML may order GPUs differently); else
    CUDA_VISIBLE_DEVICES's numbers; else the first `nproc`."""

    def norm(u: str) -> str:
        return u.lower().removeprefix("gpu-")

    wanted = {norm(u) for u in uuids_by_rank.values() if u}
    matched = sorted(i for i, u in monitor.uuids.items() if norm(u) in wanted)
    if matched:
        return matched
    visible = visible_indices()
    if visible:
        return visible[:nproc]
    return list(range(nproc))
