"""Caches that fill the system disk (Hugging Face, torch, Triton/Inductor, pip, conda, ModelScope, W&B) and
run outputs in the current project: where they are, how big, which disk, and how to move them.

Locations and variables are data (data/caches.toml, each row with its source); this module only resolves them
against an environment and a home folder that are parameters, so tests pass fakes.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import shlex
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from gpuready.storage.mounts import MountInfo, MountMap, mount_for

_VAR = re.compile(r"\$([A-Z_][A-Z0-9_]*)")


@dataclass(frozen=True)
class CacheSpec:
    name: str
    label: str
    paths: tuple[str, ...]
    env: str
    env_value: str
    clean: str
    note: str
    source: str
    move: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProjectSpec:
    patterns: tuple[str, ...]
    tensorboard_files: str
    source: str


@functools.cache
def _data() -> dict[str, Any]:
    text = resources.files("gpuready.storage").joinpath("data/caches.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def load_caches() -> tuple[CacheSpec, ...]:
    out = []
    for c in _data()["cache"]:
        out.append(CacheSpec(**{**c, "paths": tuple(c["paths"]), "move": tuple(c.get("move", ()))}))
    return tuple(out)


def load_project_spec() -> ProjectSpec:
    p = _data()["project"]
    return ProjectSpec(tuple(p["patterns"]), p["tensorboard_files"], p["source"])


def resolve_location(candidates: tuple[str, ...], env: Mapping[str, str], home: str, user: str) -> str:
    """The first candidate whose $VARIABLES are all set (and not empty); `~` is `home`, {user} the user."""
    for cand in candidates:
        names = _VAR.findall(cand)
        if any(not env.get(n) for n in names):
            continue
        path = _VAR.sub(lambda m: env[m.group(1)], cand).replace("{user}", user)
        if path.startswith("~"):
            path = home + path[1:]
        return os.path.normpath(path)
    return ""


@dataclass(frozen=True)
class TreeUsage:
    bytes: int  # allocated on disk (st_blocks x 512), each inode once
    files: int
    unreadable_dirs: int


def tree_usage(path: str) -> TreeUsage:
    """Disk use of a folder like `du`: symlinks not followed, hard links counted once, unreadable skipped."""
    seen: set[tuple[int, int]] = set()
    total = files = bad = 0
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            bad += 1
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(e.path)
                continue
            if stat.S_ISLNK(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            files += 1
    return TreeUsage(total, files, bad)


@dataclass(frozen=True)
class CacheReport:
    name: str
    label: str
    path: str
    exists: bool
    size_bytes: int | None
    files: int | None
    mount_point: str | None
    on_system_disk: bool | None
    env: str
    env_set: str | None  # the variable's current value, if any
    move_to: str | None  # the folder it would live in after the move
    commands: list[str]  # exact commands to move it (empty when it is not on the system disk)
    clean: str
    note: str
    source: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProjectFolder:
    path: str
    kind: str  # the pattern it matched, or "tensorboard"
    size_bytes: int
    files: int
    mount_point: str | None
    on_system_disk: bool | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def choose_data_folder(mmap: MountMap) -> str | None:
    """Where caches should go: the platform's data folder when one is recognised and exists, else the local
    data disk with the most free space, else a network disk; None when only the system disk exists."""
    for status in mmap.layout:
        if status.layout.role == "data" and status.exists:
            return status.path
    for kind in ("data", "network"):
        disks = [m for m in mmap.mounts if m.kind == kind and m.free_bytes]
        if disks:
            return max(disks, key=lambda m: m.free_bytes or 0).mount_point
    return None


def _on_system(m: MountInfo | None) -> bool | None:
    return None if m is None else m.kind == "system"


def cache_reports(
    mmap: MountMap,
    *,
    env: Mapping[str, str] | None = None,
    home: str | None = None,
    user: str | None = None,
    dest: str | None = None,
    measure: bool = True,
) -> list[CacheReport]:
    env = dict(os.environ if env is None else env)
    home = home or os.path.expanduser("~")
    user = user or env.get("USER") or env.get("LOGNAME") or "root"
    dest = dest if dest is not None else choose_data_folder(mmap)
    out = []
    for spec in load_caches():
        path = resolve_location(spec.paths, env, home, user)
        exists = bool(path) and os.path.isdir(path)
        usage = tree_usage(path) if exists and measure else None
        m = mount_for(mmap.mounts, path) if path else None
        on_system = _on_system(m)
        move_to: str | None = None
        commands: list[str] = []
        if dest and on_system:
            value = spec.env_value.format(dest=dest)
            moved_env = {**env, spec.env: value}
            move_to = resolve_location(spec.paths, moved_env, home, user)
            if exists and move_to and move_to != path:
                q_path, q_new = shlex.quote(path), shlex.quote(move_to)
                commands.append(f"mkdir -p {shlex.quote(os.path.dirname(move_to))} && mv {q_path} {q_new}")
            commands.append(f"export {spec.env}={shlex.quote(value)}")
            commands.append(f"echo 'export {spec.env}={shlex.quote(value)}' >> ~/.bashrc")
            commands.extend(c.format(dest=dest) for c in spec.move)
        out.append(
            CacheReport(
                name=spec.name,
                label=spec.label,
                path=path,
                exists=exists,
                size_bytes=usage.bytes if usage else (0 if not exists else None),
                files=usage.files if usage else (0 if not exists else None),
                mount_point=m.mount_point if m else None,
                on_system_disk=on_system,
                env=spec.env,
                env_set=env.get(spec.env),
                move_to=move_to,
                commands=commands,
                clean=spec.clean,
                note=spec.note,
                source=spec.source,
            )
        )
    return out


def project_folders(mmap: MountMap, cwd: str | None = None, max_depth: int = 3) -> list[ProjectFolder]:
    """Checkpoint, log and run folders under `cwd` (to `max_depth`), sized; symlinks are not followed."""
    spec = load_project_spec()
    root = os.path.abspath(cwd or os.getcwd())
    found: list[tuple[str, str]] = []
    tb_dirs: set[str] = set()
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.is_symlink():
                continue
            if e.is_dir(follow_symlinks=False):
                match = next((p for p in spec.patterns if fnmatch.fnmatch(e.name, p)), None)
                if match is not None:
                    found.append((e.path, match))
                elif depth + 1 < max_depth and not e.name.startswith("."):
                    stack.append((e.path, depth + 1))
            elif fnmatch.fnmatch(e.name, spec.tensorboard_files):
                tb_dirs.add(folder)
    inside = {p for p, _ in found}
    for d in sorted(tb_dirs):
        if not any(d == p or d.startswith(p + os.sep) for p in inside):
            found.append((d, "tensorboard"))
    out = []
    for path, kind in sorted(found):
        u = tree_usage(path)
        m = mount_for(mmap.mounts, path)
        out.append(ProjectFolder(path, kind, u.bytes, u.files, m.mount_point if m else None, _on_system(m)))
    return out


@dataclass(frozen=True)
class StorageReport:
    """`gpuready storage [PATH]`: the mount map, caches, project folders and advice."""

    mounts: MountMap
    caches: list[CacheReport]
    project: list[ProjectFolder]
    data_folder: str | None
    advice: list[str]
    path: str | None = None
    path_mount: str | None = None
    projection: dict[str, Any] | None = field(default=None)

    def to_json(self) -> dict[str, Any]:
        data = self.mounts.to_json()
        data.update(
            {
                "path": self.path,
                "path_mount": self.path_mount,
                "data_folder": self.data_folder,
                "caches": [c.to_json() for c in self.caches],
                "project": [p.to_json() for p in self.project],
                "advice": self.advice,
                "projection": self.projection,
            }
        )
        return data


def advise(mmap: MountMap, caches: list[CacheReport], project: list[ProjectFolder], dest: str | None) -> list[str]:
    """Plain sentences for a person, most important first."""
    tips: list[str] = []
    system = mmap.system
    if system and system.total_bytes and system.free_bytes is not None:
        free_share = system.free_bytes / system.total_bytes
        if free_share < 0.10:
            tips.append(f"the system disk {system.mount_point} is {100 - free_share * 100:.0f}% full")
    heavy = [c for c in caches if c.on_system_disk and (c.size_bytes or 0) > 0]
    if heavy and dest:
        names = ", ".join(c.name for c in sorted(heavy, key=lambda c: -(c.size_bytes or 0)))
        tips.append(f"move caches off the system disk to {dest}: {names} (commands listed per cache)")
    elif heavy:
        tips.append("caches sit on the system disk and no data disk was found; clean them or attach a volume")
    on_sys = [p for p in project if p.on_system_disk and p.size_bytes > 0]
    if on_sys and dest:
        tips.append(f"{len(on_sys)} checkpoint/log folder(s) of this project are on the system disk; write to {dest}")
    for status in mmap.layout:
        if status.exists and status.layout.survives_release is True:
            tips.append(
                f"{status.platform}: copy results to {status.path} before releasing the instance "
                "(`gpuready sync SRC DEST` verifies the copy); typical, check the platform's page"
            )
    return tips
