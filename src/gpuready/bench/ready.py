"""Where "time to ready" starts: when the machine was ordered (`--ordered-at`, the only true figure), else when
it started.

"Started" is the later of the kernel's boot time (psutil.boot_time(), /proc/stat's btime) and the start of
process 1: on a VM both are the boot; in a container process 1 is the container's own first process, while
btime is the host's boot, which can be days earlier.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from gpuready.errors import InputError


@dataclass(frozen=True)
class Reference:
    kind: str  # "ordered_at", "boot", "container_start", "bench_start"
    at: float
    note: str | None = None


def _boot_time() -> float | None:
    try:
        import psutil

        return float(psutil.boot_time())
    except Exception:
        return None


def _init_start() -> float | None:
    try:
        import psutil

        return float(psutil.Process(1).create_time())
    except Exception:
        return None


def parse_ordered_at(text: str) -> float:
    """ISO 8601 (`2026-11-30T21:04:05Z`, `2026-11-30 21:04:05+01:00`) or epoch seconds; naive times are UTC."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            "--ordered-at", f"{text!r}: give an ISO time (2026-11-30T21:04:05Z) or epoch seconds"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def reference(
    ordered_at: float | None,
    bench_started_at: float,
    *,
    boot_time: Callable[[], float | None] = _boot_time,
    init_start: Callable[[], float | None] = _init_start,
) -> Reference:
    if ordered_at is not None:
        if ordered_at > bench_started_at:
            raise InputError("--ordered-at", "is after the bench started; give when the machine was ordered")
        return Reference("ordered_at", ordered_at)
    boot, init = boot_time(), init_start()
    if boot is None and init is None:
        return Reference("bench_start", bench_started_at, "no boot time readable: counted from the bench's start")
    if init is not None and (boot is None or init > boot + 1.0):
        return Reference(
            "container_start", init, "process 1 started after the kernel booted: a container; its start is used"
        )
    assert boot is not None
    return Reference("boot", boot, "the machine's boot (give --ordered-at for the time from ordering it)")
