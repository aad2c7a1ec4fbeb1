"""The bench record: what one platform delivered on one fixed job (`gpuready bench -o FILE`).

A versioned JSON document (`schema_version`); `compare` reads any version it knows and refuses newer ones.
Unknown numbers are null, never guessed. Faults (no GPU, out of memory, a crash, a hung driver) are a
`status` with an `error`, and everything measured before the fault is kept.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
RECORD_KIND = "gpuready-bench"

# How a bench ended. "ok": the job ran for the whole --minutes (or the command ran to its end).
BenchStatus = Literal["ok", "no_gpu", "oom", "cuda_error", "failed", "timeout", "hung", "interrupted", "unsupported"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuInfo(_Model):
    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None


class Machine(_Model):
    host: str
    label: str  # what `compare` calls this platform (--label; the host name by default)
    cpus: int | None = None
    memory_bytes: int | None = None
    driver_version: str | None = None
    cuda_driver: str | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)  # the GPUs the job used


class Job(_Model):
    kind: Literal["probe", "command"]
    description: str  # "llama-3.2-1b full bf16 batch 4 seq 1024" or the command line
    workload: dict[str, Any] | None = None  # the probe's workload (the workload fields of docs/cli.md)
    argv: list[str] | None = None  # the user's command
    nproc: int = 1  # processes (GPUs) the job ran on
    seed: int | None = None
    unit: str | None = None  # "tokens", "images", or None when the command reports no work
    minutes: float  # how long the job ran after its first step; a command: its wall limit (0: to its end)


class Ready(_Model):
    """Time to ready: from `reference_at` to the end of the first GPU step that succeeded."""

    reference: Literal["ordered_at", "boot", "container_start", "bench_start"]
    reference_at: float  # epoch seconds
    bench_started_at: float
    first_step_at: float | None = None
    seconds: float | None = None  # first_step_at - reference_at
    bench_seconds: float | None = None  # first_step_at - bench_started_at (gpuready's own start to a step)
    note: str | None = None


class DoctorVerdict(_Model):
    ready: bool | None = None  # None: the doctor could not run
    cause: str | None = None  # the check that stops torch from using the GPU, with its detail
    failed: list[str] = Field(default_factory=list)
    warned: list[str] = Field(default_factory=list)
    seconds: float | None = None
    error: str | None = None


class Interval(_Model):
    start_seconds: float  # since the end of the first step
    seconds: float
    steps: int  # steps that ended in it
    units: float  # the work of the steps that ran in it (a step across a boundary is split by its time)
    per_second: float | None  # units / seconds


class Throughput(_Model):
    unit: str | None = None  # "tokens" or "images"
    steps: int = 0
    units_total: float = 0.0
    interval_seconds: float
    intervals: list[Interval] = Field(default_factory=list)
    median_per_second: float | None = None  # over intervals
    mean_per_second: float | None = None
    min_per_second: float | None = None
    max_per_second: float | None = None
    cv: float | None = None  # standard deviation / mean of the intervals
    spread: float | None = None  # (max - min) / median of the intervals
    effective_per_second: float | None = None  # all work / wall time from the first step's end to the last's
    ran_seconds: float = 0.0  # first step's end to the last step's end
    stable_seconds: float = 0.0  # intervals within ±STABLE_BAND of the median and free of GPU faults
    first_step_seconds: float | None = None  # the warm-up step, left out of the intervals


class GpuHealth(_Model):
    samples: int = 0
    sample_seconds: float | None = None
    sm_clock_mhz_median: float | None = None
    sm_clock_mhz_min: int | None = None
    max_sm_clock_mhz: int | None = None
    power_watts_median: float | None = None
    power_watts_max: float | None = None
    power_limit_watts: float | None = None
    temperature_c_max: int | None = None
    utilization_percent_median: float | None = None
    memory_used_bytes_max: int | None = None
    throttle_seconds: dict[str, float] = Field(default_factory=dict)  # reason -> seconds it was active
    bad_throttle_seconds: float = 0.0  # hardware slowdown, thermal, power brake
    xid_events: list[dict[str, Any]] = Field(default_factory=list)  # {gpu, xid, at_seconds}
    xid_supported: bool = False
    ecc_corrected_new: int | None = None  # during the bench, summed over the job's GPUs
    ecc_uncorrected_new: int | None = None
    series: list[dict[str, Any]] = Field(default_factory=list)  # {t, sm_clock_mhz, power_watts, ...} ≤ 240


class Memory(_Model):
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_device_bytes: int | None = None
    nvml_used_bytes_max: int | None = None
    gpu_total_bytes: int | None = None


class Disk(_Model):
    path: str
    bytes: int = 0
    write_bytes_per_second: float | None = None
    read_bytes_per_second: float | None = None
    random_read_iops: float | None = None
    direct: bool = False  # O_DIRECT (bypassing the page cache) was used
    seconds: float | None = None
    error: str | None = None


class Price(_Model):
    per_hour: float | None = None  # for the GPUs the job used
    currency: str = "USD"
    source: str | None = None  # "--price-per-hour" or the catalog row's provider, date and source


class BenchRecord(_Model):
    schema_version: int = SCHEMA_VERSION
    kind: str = RECORD_KIND
    gpuready_version: str
    created_at: str  # ISO 8601, UTC
    status: BenchStatus
    error: str | None = None
    errors: list[str] = Field(default_factory=list)  # every problem seen, the fault first
    machine: Machine
    job: Job
    ready: Ready
    doctor: DoctorVerdict
    throughput: Throughput
    health: GpuHealth
    memory: Memory
    disk: Disk | None = None
    price: Price
    wall_seconds: float
    output_tail: list[str] = Field(default_factory=list)  # the job's last output lines when it did not end ok

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def load_record(data: dict[str, Any], origin: str = "record") -> BenchRecord:
    """Validate a record read from JSON; errors name the file and the field."""
    from pydantic import ValidationError

    from gpuready.errors import InputError

    if not isinstance(data, dict) or data.get("kind") != RECORD_KIND:
        raise InputError("RECORD", f"{origin}: not a gpuready bench record (kind must be {RECORD_KIND!r})")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise InputError("RECORD", f"{origin}: schema_version {version!r}; this gpuready reads 1 to {SCHEMA_VERSION}")
    try:
        return BenchRecord.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError("RECORD", f"{origin}: {where}: {first['msg']}") from None
