"""Storage on rented GPU machines: which disk is which, caches, duplicates, projection, manifests, sync.

Names are imported on first use (PEP 562), so `storage dupes` or `manifest verify` does not pay for the
workload model (pydantic) that only the storage report and the disk projection need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuready.storage.caches import CacheReport, StorageReport
    from gpuready.storage.dedupe import DedupePlan, apply_plan, make_plan
    from gpuready.storage.dupes import DupeGroup, DupesReport, find_duplicates
    from gpuready.storage.manifest import ManifestResult, VerifyResult, create_manifest, verify_manifest
    from gpuready.storage.mounts import MountInfo, MountMap, mount_map, parse_mountinfo
    from gpuready.storage.projection import DiskProjection, job_sizes, project_disk
    from gpuready.storage.report import storage_report
    from gpuready.storage.runner import Runner, RunResult, SubprocessRunner

# eager: `sync` is also the submodule's name, and importing the submodule would set the package attribute
# `sync` to the module; importing the function here (cheap: no pydantic) keeps the name the function
from gpuready.storage.sync import SyncResult, sync

_WHERE = {
    "CacheReport": "caches",
    "StorageReport": "caches",
    "DedupePlan": "dedupe",
    "DupeGroup": "dupes",
    "DupesReport": "dupes",
    "apply_plan": "dedupe",
    "find_duplicates": "dupes",
    "make_plan": "dedupe",
    "ManifestResult": "manifest",
    "VerifyResult": "manifest",
    "create_manifest": "manifest",
    "verify_manifest": "manifest",
    "MountInfo": "mounts",
    "MountMap": "mounts",
    "mount_map": "mounts",
    "parse_mountinfo": "mounts",
    "DiskProjection": "projection",
    "job_sizes": "projection",
    "project_disk": "projection",
    "storage_report": "report",
    "Runner": "runner",
    "RunResult": "runner",
    "SubprocessRunner": "runner",
}

__all__ = [
    "CacheReport",
    "DedupePlan",
    "DiskProjection",
    "DupeGroup",
    "DupesReport",
    "ManifestResult",
    "MountInfo",
    "MountMap",
    "RunResult",
    "Runner",
    "StorageReport",
    "SubprocessRunner",
    "SyncResult",
    "VerifyResult",
    "apply_plan",
    "create_manifest",
    "find_duplicates",
    "job_sizes",
    "make_plan",
    "mount_map",
    "parse_mountinfo",
    "project_disk",
    "storage_report",
    "sync",
    "verify_manifest",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuready.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gpuready.storage.{module}"), name)
    globals()[name] = value
    return value
