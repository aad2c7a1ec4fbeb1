"""Run the steps of the careful method for one job and give one verdict (docs/cli.md `gpuready check`).

Each step calls the capability that owns it (memory.estimate, doctor.doctor, trial.api.trial_probe,
storage.projection) and turns its answer into `{name, status, checks}`; nothing here measures anything itself.
The steps that need what the machine has (the image, the trial) are injectable for tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpuready.doctor.job import JobPackage, missing_job_packages
from gpuready.errors import InputError
from gpuready.models import ModelSpec
from gpuready.units import format_bytes
from gpuready.workload import Workload, describe

if TYPE_CHECKING:
    from gpuready.memory.result import MemoryEstimate

Status = Literal["pass", "warn", "fail", "skip"]


@dataclass(frozen=True)
class Step:
    name: str
    status: Status
    summary: str
    checks: list[dict[str, Any]] = field(default_factory=list)  # {name, status, detail, fix}
    fixes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # the owning capability's own JSON


@dataclass(frozen=True)
class CheckResult:
    ready: bool
    workload: dict[str, Any]
    steps: list[Step]
    fixes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "workload": self.workload,
            "steps": [asdict(s) for s in self.steps],
            "fixes": self.fixes,
        }


def _gpu_memory_here() -> tuple[int | None, str | None]:
    """Total memory and name of the first GPU NVML reports (None where there is no driver or GPU)."""
    from gpuready.nvml import read_nvml

    report = read_nvml()
    if not report.available or not report.gpus:
        return None, None
    gpu = report.gpus[0]
    return gpu.memory_total_bytes, gpu.name


def _size_line(est: MemoryEstimate, where: str | None) -> str:
    """The peak on the card and the verdict. A job that fits only by freeing the allocator's cache shows the peak
    it reaches on the card (the replay under the card's limit), with the peak it would reach with no limit beside
    it, so the figure never reads as larger than the card it fits."""
    context = est.peak_device_bytes - est.peak_reserved_bytes
    if est.fits and est.reserved_on_card_bytes is not None and est.cache_releases:
        return (
            f"{format_bytes(est.reserved_on_card_bytes + context)} at the peak ({est.phase}) on {where}, freeing its "
            f"cache on the way ({format_bytes(est.peak_device_bytes)} with no limit): fits"
        )
    return f"{format_bytes(est.peak_device_bytes)} at the peak ({est.phase}) on {where}: " + (
        "fits" if est.fits else "does not fit"
    )


def size_step(workload: Workload, capacity: int | None, where: str | None, spec: ModelSpec | None = None) -> Step:
    from gpuready.catalog import load_gpus
    from gpuready.memory import estimate

    if capacity is not None:
        est = estimate(workload, capacity, spec=spec)
        line = _size_line(est, where) + f"; largest batch that fits {est.max_batch}"
        data = est.to_json()
        fixes: list[str] = []
        if not est.fits:  # what would fit, computed once for the card of this answer
            from gpuready.memory.mitigations import suggest

            found = suggest(workload, capacity)
            data["mitigations"] = [m.to_json() for m in found]
            fixes = [f"{m.change} ({format_bytes(m.peak_device_bytes)})" for m in found if m.fits]
        return Step("size", "pass" if est.fits else "fail", line, fixes=fixes, data=data)
    # no GPU here: the plan instead — which cards of the catalog would hold it
    est = estimate(workload, spec=spec)
    cards: list[dict[str, Any]] = []
    for gpu in load_gpus():
        on_card = estimate(workload, gpu.usable_bytes, spec=spec)
        cards.append(
            {
                "gpu": gpu.name,
                "fits": on_card.fits,
                "max_batch": on_card.max_batch,
                "headroom_bytes": on_card.headroom_bytes,
            }
        )
    fitting = [str(c["gpu"]) for c in cards if c["fits"]]
    line = f"{format_bytes(est.peak_device_bytes)} at the peak ({est.phase}); no GPU here, " + (
        f"fits on: {', '.join(fitting)}" if fitting else "fits on none of the catalog's cards"
    )
    return Step("size", "warn" if fitting else "fail", line, data={**est.to_json(), "cards": cards})


def image_step(report: Any, missing: list[JobPackage] | None = None) -> Step:
    """The doctor's verdict, and the packages the job's own options import that are not installed here
    (doctor/job.py): each a failed check with its install command."""
    checks = [c.to_dict() for c in report.checks if c.status != "pass"]
    cause = report.cause
    line = "ready" if report.ready else f"not ready: {cause.name}: {cause.detail}" if cause else "not ready"
    fixes = [cause.fix] if cause is not None and cause.fix else []
    for p in missing or []:
        detail = f"{p.dist} is not installed ({p.why})"
        checks.append({"name": f"job-package:{p.dist}", "status": "fail", "detail": detail, "fix": p.fix})
        fixes.append(p.fix)
    ready = report.ready and not missing
    if report.ready and missing:
        line = "not ready: the job needs " + ", ".join(f"{p.dist} ({p.why})" for p in missing) + ", not installed"
    return Step("image", "pass" if ready else "fail", line, checks=checks, fixes=fixes, data=report.to_dict())


def trial_step(result: Any, predicted_device: int | None) -> Step:
    data = result.to_json()
    points = result.points
    if not points:
        return Step("trial", "fail", "the trial ran no point", data=data)
    if result.max is not None:
        line = f"largest {result.variable} that runs: {result.max} ({len(points)} runs)"
        return Step("trial", "pass" if result.max >= 1 else "fail", line, data=data)
    point = points[-1]
    if not point.ok:
        return Step("trial", "fail", f"{point.status}: {point.error}", data=data)
    line = f"ran: {format_bytes(point.peak_device_bytes)} on the device"
    if predicted_device and point.peak_device_bytes:
        line += f" (predicted {format_bytes(predicted_device)}, {point.peak_device_bytes / predicted_device - 1:+.1%})"
    if point.step_seconds:
        line += f", {point.step_seconds:.3f} s a step"
    return Step("trial", "pass", line, data=data)


def storage_step(workload: Workload, path: Path) -> Step:
    from gpuready.storage.mounts import statvfs_usage
    from gpuready.storage.projection import job_sizes, project_disk

    sizes = job_sizes(workload)
    usage = statvfs_usage(str(path))
    total, free = (usage[0], usage[1]) if usage else (None, None)
    proj = project_disk(
        free_bytes=free,
        total_bytes=total,
        mount_point=str(path),
        model_bytes=sizes.model_bytes,
        checkpoint_bytes=sizes.checkpoint_bytes,
        assumptions=sizes.assumptions,
    )
    status: Status = "warn" if proj.fits is None or proj.warn else ("pass" if proj.fits else "fail")
    line = f"{format_bytes(proj.need_bytes)} to write in {path}: {proj.message}"
    fixes = ["move the caches and checkpoints to a data disk: see `gpuready storage`"] if status != "pass" else []
    return Step("storage", status, line, fixes=fixes, data=proj.to_json())


def _missing_packages(
    w: Workload, spec: ModelSpec | None, find: Callable[[str], Any] | None, framework: str | None
) -> list[JobPackage]:
    from gpuready.models import resolve_model
    from gpuready.models.vision import is_transformers_vision

    try:
        spec = spec or resolve_model(w.model, w.as_family)
    except (InputError, OSError, ValueError):  # (the size step reports a model it cannot read)
        return []
    vision = spec.kind == "vision"
    torchvision_model = vision and not is_transformers_vision(spec.vision or {})
    kwargs = {"find": find} if find is not None else {}
    return missing_job_packages(w, vision=vision, torchvision_model=torchvision_model, framework=framework, **kwargs)


def check(
    workload: Workload,
    *,
    gpu_memory_bytes: int | None = None,
    gpu_label: str | None = None,
    spec: ModelSpec | None = None,
    warnings: list[str] | None = None,
    quick: bool = False,
    find_max: bool = False,
    requirements: Path | None = None,
    path: Path = Path("."),
    gpu_here: Callable[[], tuple[int | None, str | None]] = _gpu_memory_here,
    run_doctor: Callable[..., Any] | None = None,
    run_trial: Callable[..., Any] | None = None,
    find_package: Callable[[str], Any] | None = None,
    framework: str | None = None,
) -> CheckResult:
    """The preflight. `quick` skips the live torch probe and the trial; without a GPU the trial is skipped and
    the size step becomes the plan over the GPU catalog. `gpu_label` names the card `gpu_memory_bytes` came from;
    `warnings` (the workload read against its model and card) become warn checks of the task step. `framework`:
    the format of the workload file the job came from (its tool's packages are the job's, doctor/job.py)."""
    notes = [{"name": "workload", "status": "warn", "detail": w, "fix": ""} for w in warnings or []]
    steps: list[Step] = [
        Step("task", "warn" if notes else "pass", describe(workload), notes, data=workload.model_dump(mode="json"))
    ]
    here, name = gpu_here()
    capacity = gpu_memory_bytes if gpu_memory_bytes is not None else here
    if gpu_memory_bytes is not None:
        where = f"{gpu_label} ({format_bytes(capacity)})" if gpu_label else format_bytes(capacity)
    else:
        where = name or "this GPU"
    size = size_step(workload, capacity, where, spec)
    steps.append(size)
    if run_doctor is None:
        from gpuready.doctor import doctor

        run_doctor = doctor
    missing = _missing_packages(workload, spec, find_package, framework)
    steps.append(image_step(run_doctor(requirements, fast=quick), missing))
    if quick:
        steps.append(Step("trial", "skip", "skipped (--quick)"))
    elif here is None:
        steps.append(Step("trial", "skip", "skipped: no GPU on this machine"))
    elif steps[-1].status == "fail":
        steps.append(Step("trial", "skip", "skipped: the image is not ready"))
    else:
        if run_trial is None:
            from gpuready.trial.api import trial_probe

            run_trial = trial_probe
        predicted = size.data.get("peak_device_bytes")
        result = run_trial(workload, find_max="batch" if find_max else None, db=None)
        steps.append(trial_step(result, predicted))
    steps.append(storage_step(workload, path))
    fixes = [f for s in steps for f in s.fixes]
    ready = all(s.status in ("pass", "warn", "skip") for s in steps) and any(
        s.name == "size" and s.status == "pass" for s in steps
    )
    return CheckResult(ready, workload.model_dump(mode="json"), steps, fixes)
