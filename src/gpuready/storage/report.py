"""`gpuready storage [PATH]` as one library call: mounts, caches, project folders, projection and advice."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuready.storage.caches import StorageReport, advise, cache_reports, choose_data_folder, project_folders
from gpuready.storage.mounts import UsageFn, mount_map, statvfs_usage
from gpuready.storage.projection import job_sizes, project_disk
from gpuready.workload import Workload


def storage_report(
    path: str | None = None,
    *,
    workload: Workload | None = None,
    keep_checkpoints: int = 2,
    dataset_bytes: int = 0,
    mountinfo_text: str | None = None,
    usage: UsageFn = statvfs_usage,
    env: Mapping[str, str] | None = None,
    home: str | None = None,
    cwd: str | None = None,
    measure: bool = True,
    include_internal: bool = False,
) -> StorageReport:
    """Everything `gpuready storage` shows. PATH is the disk the job will write to (default: the data folder
    when one is found, else the current folder); the projection is made for the mount holding it."""
    cwd = os.path.abspath(cwd or os.getcwd())
    extra = [os.path.abspath(path)] if path else []
    mmap = mount_map(
        mountinfo_text,
        usage=usage,
        home=home,
        cwd=cwd,
        extra_paths=extra,
        include_internal=include_internal,
    )
    dest = choose_data_folder(mmap)
    caches = cache_reports(mmap, env=env, home=home, dest=dest, measure=measure)
    project = project_folders(mmap, cwd) if measure else []
    target = os.path.abspath(path) if path else (dest or cwd)
    target_mount = mmap.mount_for(target)
    projection = None
    if workload is not None or dataset_bytes:
        sizes = job_sizes(workload) if workload is not None else None
        projection = project_disk(
            free_bytes=target_mount.free_bytes if target_mount else None,
            total_bytes=target_mount.total_bytes if target_mount else None,
            mount_point=target_mount.mount_point if target_mount else None,
            model_bytes=sizes.model_bytes if sizes else 0,
            checkpoint_bytes=sizes.checkpoint_bytes if sizes else 0,
            keep_checkpoints=keep_checkpoints,
            dataset_bytes=dataset_bytes,
            assumptions=sizes.assumptions if sizes else [],
        ).to_json()
    advice = advise(mmap, caches, project, dest)
    if projection is not None and projection["fits"] is False:
        advice.insert(0, f"the job needs more than the free space of {projection['mount_point']}")
    elif projection is not None and projection["warn"]:
        advice.insert(0, f"the job leaves little free space on {projection['mount_point']}")
    return StorageReport(
        mounts=mmap,
        caches=caches,
        project=project,
        data_folder=dest,
        advice=advice,
        path=target,
        path_mount=target_mount.mount_point if target_mount else None,
        projection=projection,
    )
