"""Storage on rented GPU machines: which disk is which, caches, duplicates, projection, manifests, sync."""

from gpuready.storage.caches import CacheReport, StorageReport
from gpuready.storage.dupes import DedupePlan, DupeGroup, DupesReport, apply_plan, find_duplicates, make_plan
from gpuready.storage.manifest import ManifestResult, VerifyResult, create_manifest, verify_manifest
from gpuready.storage.mounts import MountInfo, MountMap, mount_map, parse_mountinfo
from gpuready.storage.projection import DiskProjection, job_sizes, project_disk
from gpuready.storage.report import storage_report
from gpuready.storage.runner import Runner, RunResult, SubprocessRunner
from gpuready.storage.sync import SyncResult, sync

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
