"""`env snapshot` / `env diff`: record an environment as JSON (python, packages as pip freeze sees them,
torch and
its CUDA, driver, GPUs, GPU-related variables) and list what changed between two records or two machines."""

from __future__ import annotations

import datetime as dt
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuready.doctor.checks import DoctorFacts
from gpuready.doctor.packages import freeze
from gpuready.doctor.tables import format_capability
from gpuready.errors import InputError

SCHEMA = "gpuready.env-snapshot/1"
_NOT_COMPARED = {"schema", "created"}


def take_snapshot(facts: DoctorFacts) -> dict[str, Any]:
    scan, nvml, s = facts.packages, facts.nvml, facts.system
    build = scan.torch_builds[0] if scan.torch_builds else None
    cuda = nvml.cuda_driver
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": {"version": s.python_version, "executable": s.python_executable, "venv": s.in_venv},
        "packages": freeze(scan),
        "torch": (
            {
                "version": build.version,
                "cuda": build.cuda,
                "hip": build.hip,
                "variant": build.variant,
                "location": build.location,
            }
            if build
            else None
        ),
        "driver": {
            "version": nvml.driver_version,
            "cuda": f"{cuda[0]}.{cuda[1]}" if cuda else None,
            "error": nvml.error,
        },
        "gpus": [
            {
                "name": g.name,
                "uuid": g.uuid,
                "memory_total_bytes": g.memory_total_bytes,
                "compute_capability": format_capability(g.compute_capability) if g.compute_capability else None,
            }
            for g in nvml.gpus
        ],
        "nvcc": facts.nvcc_version,
        "env": dict(s.env),
    }


def load_snapshot(path: Path, field: str = "FILE") -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(field, f"cannot read {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(field, f"{path} is not JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InputError(field, f"{path} is not a gpuready env snapshot (made by `gpuready env snapshot -o FILE`)")
    return data


@dataclass(frozen=True)
class Change:
    key: str  # "packages.torch", "driver.version", "gpus[0].name"
    before: Any
    after: Any

    @property
    def kind(self) -> str:
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        return "changed"


@dataclass(frozen=True)
class SnapshotDiff:
    changes: tuple[Change, ...]

    @property
    def same(self) -> bool:
        return not self.changes


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value


def diff_snapshots(a: dict[str, Any], b: dict[str, Any]) -> SnapshotDiff:
    """Every leaf that differs, in a stable order (python, torch, driver, gpus, env, packages, the rest)."""
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    _flatten({k: v for k, v in a.items() if k not in _NOT_COMPARED}, "", flat_a)
    _flatten({k: v for k, v in b.items() if k not in _NOT_COMPARED}, "", flat_b)
    order = ("python", "torch", "driver", "gpus", "nvcc", "env", "packages")

    def rank(key: str) -> tuple[int, str]:
        head = key.split(".", 1)[0].split("[", 1)[0]
        return (order.index(head) if head in order else len(order), key)

    keys = sorted(set(flat_a) | set(flat_b), key=rank)
    return SnapshotDiff(tuple(Change(k, flat_a.get(k), flat_b.get(k)) for k in keys if flat_a.get(k) != flat_b.get(k)))
