"""The mount map: every filesystem with size, free space, type and device, and which one is the system disk.

Read from /proc/self/mountinfo, not psutil.disk_partitions(): with its default `all=False` psutil keeps only
fstypes not marked `nodev` in /proc/filesystems, which drops a container's `overlay` root and `nfs`/`fuse`
network mounts (giampaolo/psutil `psutil/_pslinux.py`, `disk_partitions`). Rule (reference/storage.md §1e):
system = the filesystem of `/` and anything on the same device; data = another local block device;
network = nfs/cifs/fuse/ceph...; memory = tmpfs (counts against RAM, gone at reboot), /dev/shm included;
overlay = an overlay mounted somewhere other than `/` (a container layer: its free space is its own).
A path is mapped to its mount after resolving symlinks (`/data -> /mnt/nvme/data` lives on /mnt/nvme), and a
path the user asked about is shown on its own mount even where that mount is plumbing (/dev/shm, /run/...).
"""

from __future__ import annotations

import functools
import os
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any, Literal

Kind = Literal["system", "data", "network", "memory", "overlay", "other", "internal"]
Usage = tuple[int, int, int]  # total, free (for unprivileged users), used; bytes
UsageFn = Callable[[str], Usage | None]

_PSEUDO = frozenset(
    {
        *("proc", "sysfs", "cgroup", "cgroup2", "devpts", "devtmpfs", "mqueue", "securityfs", "debugfs"),
        *("tracefs", "bpf", "pstore", "hugetlbfs", "configfs", "fusectl", "binfmt_misc", "autofs", "nsfs"),
        *("rpc_pipefs", "efivarfs", "selinuxfs", "fuse.lxcfs", "fuse.portal"),
    }
)
_NETWORK = frozenset(
    {
        *("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "9p", "afs", "beegfs"),
        *("gpfs", "wekafs", "virtiofs", "juicefs"),
    }
)
_MEMORY = frozenset({"tmpfs", "ramfs"})
_SHM = frozenset({"/dev/shm", "/run/shm"})
# mount points below these hold the OS's plumbing (and containers' /etc/hosts-style file bind mounts)
_INTERNAL_PREFIXES = ("/proc", "/sys", "/dev", "/run", "/etc", "/usr", "/boot", "/snap", "/var/lib/docker")


def _unescape(field_text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \040 \011 \012 \134 (proc(5))
    out = []
    i = 0
    while i < len(field_text):
        if field_text[i] == "\\" and field_text[i + 1 : i + 4].isdigit() and len(field_text) > i + 3:
            out.append(chr(int(field_text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field_text[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo (proc(5))."""

    mount_id: int
    parent_id: int
    device: str  # major:minor
    root: str  # the folder of the filesystem that is mounted here (bind mounts: not "/")
    mount_point: str
    options: str
    fstype: str
    source: str


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse mountinfo text; malformed lines are skipped (they are never produced by a real kernel)."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        parts = line.split()
        if "-" not in parts:
            continue
        sep = parts.index("-")
        if sep < 6 or len(parts) < sep + 3:
            continue
        try:
            mount_id, parent_id = int(parts[0]), int(parts[1])
        except ValueError:
            continue
        mounts.append(
            Mount(
                mount_id=mount_id,
                parent_id=parent_id,
                device=parts[2],
                root=_unescape(parts[3]),
                mount_point=_unescape(parts[4]),
                options=parts[5],
                fstype=parts[sep + 1],
                source=_unescape(parts[sep + 2]),
            )
        )
    return mounts


def classify(m: Mount, root_device: str | None) -> Kind:
    mp = m.mount_point
    if mp == "/":
        return "system"
    if m.fstype in _MEMORY and mp in _SHM:
        return "memory"  # shared memory is where people put data to go fast: never hidden
    if m.fstype in _PSEUDO or any(mp == p or mp.startswith(p + "/") for p in _INTERNAL_PREFIXES):
        return "internal"
    if m.fstype in _NETWORK or m.fstype.startswith("fuse.") or m.fstype == "fuse":
        return "network"
    if m.fstype in _MEMORY:
        return "memory"
    if m.fstype == "overlay":
        return "overlay"
    if root_device is not None and m.device == root_device:
        return "system"
    if m.source.startswith("/dev/"):
        return "data"
    return "other"


def statvfs_usage(path: str) -> Usage | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize)


# ---------------------------------------------------------------------------------------------------------
# Platform layouts (data/layouts.toml)


@dataclass(frozen=True)
class LayoutPath:
    path: str
    role: str
    size_note: str
    survives_stop: bool | str
    survives_release: bool | str
    in_saved_image: bool | str
    note: str
    source: str


@dataclass(frozen=True)
class Platform:
    name: str
    detect: tuple[str, ...]
    detect_mounts: tuple[str, ...]
    source: str
    paths: tuple[LayoutPath, ...]


@functools.cache
def load_platforms() -> tuple[Platform, ...]:
    text = resources.files("gpuready.storage").joinpath("data/layouts.toml").read_text(encoding="utf-8")
    out = []
    for p in tomllib.loads(text)["platform"]:
        out.append(
            Platform(
                name=p["name"],
                detect=tuple(p.get("detect", ())),
                detect_mounts=tuple(p.get("detect_mounts", ())),
                source=p["source"],
                paths=tuple(LayoutPath(**lp) for lp in p.get("path", ())),
            )
        )
    return tuple(out)


def detect_platforms(mount_points: Iterable[str], exists: Callable[[str], bool]) -> list[Platform]:
    points = set(mount_points)
    return [
        p for p in load_platforms() if any(exists(d) for d in p.detect) or any(d in points for d in p.detect_mounts)
    ]


# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MountInfo:
    mount_point: str
    fstype: str
    source: str
    device: str
    kind: Kind
    total_bytes: int | None  # None: statvfs failed (unknown is a value)
    free_bytes: int | None
    used_bytes: int | None
    holds: list[str] = field(default_factory=list)  # "/", "home", "cwd" and the paths asked about
    platform: str | None = None
    layout: LayoutPath | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["layout"] = asdict(self.layout) if self.layout else None
        return data


@dataclass(frozen=True)
class LayoutStatus:
    """A folder of a recognised platform layout, where it lives here and what typically survives."""

    platform: str
    path: str
    exists: bool
    mount_point: str | None
    layout: LayoutPath

    def to_json(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "path": self.path,
            "exists": self.exists,
            "mount_point": self.mount_point,
            **{k: v for k, v in asdict(self.layout).items() if k != "path"},
            "typical": True,  # documented defaults; check the platform's page for your plan
        }


@dataclass(frozen=True)
class MountMap:
    mounts: list[MountInfo]  # internal plumbing (proc, sysfs, /etc/hosts binds...) left out
    platforms: list[str]
    layout: list[LayoutStatus] = field(default_factory=list)

    @property
    def system(self) -> MountInfo | None:
        return next((m for m in self.mounts if m.mount_point == "/"), None)

    def mount_for(self, path: str) -> MountInfo | None:
        """The mount holding `path`: the longest mount point that is a prefix (what fclones does)."""
        return mount_for(self.mounts, path)

    def to_json(self) -> dict[str, Any]:
        return {
            "platforms": self.platforms,
            "mounts": [m.to_json() for m in self.mounts],
            "layout": [s.to_json() for s in self.layout],
        }


def mount_for(mounts: Iterable[MountInfo], path: str) -> MountInfo | None:
    """The mount holding `path` after resolving symlinks (a link's own mount says nothing about its target)."""
    path = os.path.realpath(path)
    best: MountInfo | None = None
    for m in mounts:
        mp = m.mount_point
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (best is None or len(mp) > len(best.mount_point)):
            best = m
    return best


def read_mountinfo() -> str:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read()
    except OSError:
        return ""


def mount_map(
    mountinfo_text: str | None = None,
    *,
    usage: UsageFn = statvfs_usage,
    exists: Callable[[str], bool] = os.path.exists,
    home: str | None = None,
    cwd: str | None = None,
    extra_paths: Iterable[str] = (),
    include_internal: bool = False,
) -> MountMap:
    """Build the mount map. Everything the host is read through is a parameter, so tests pass fakes."""
    text = read_mountinfo() if mountinfo_text is None else mountinfo_text
    raw = parse_mountinfo(text)
    # a mount point mounted over several times: the last line is the one visible
    visible: dict[str, Mount] = {}
    for m in raw:
        visible[m.mount_point] = m
    root = visible.get("/")
    root_dev = root.device if root else None
    platforms = detect_platforms(visible, exists)
    layout_by_path = {lp.path: (p.name, lp) for p in platforms for lp in p.paths}
    infos: list[MountInfo] = []
    for m in visible.values():
        kind = classify(m, root_dev)
        u = usage(m.mount_point)
        plat, layout = layout_by_path.get(m.mount_point, (None, None))
        note = ""
        if m.mount_point == "/" and m.fstype == "overlay":
            note = "container root (overlay): the size shown is the host's container storage; "
            note += "the platform may enforce a smaller quota"
        infos.append(
            MountInfo(
                mount_point=m.mount_point,
                fstype=m.fstype,
                source=m.source,
                device=m.device,
                kind=kind,
                total_bytes=u[0] if u else None,
                free_bytes=u[1] if u else None,
                used_bytes=u[2] if u else None,
                platform=plat,
                layout=layout,
                note=note,
            )
        )
    infos.sort(key=lambda i: i.mount_point)
    labels = {"/": "/", "home": home or os.path.expanduser("~"), "cwd": cwd or os.getcwd()}
    labels.update({p: p for p in extra_paths})
    holds: dict[str, list[str]] = {}
    for label, path in labels.items():
        m_for = mount_for(infos, path)
        if m_for is not None:
            holds.setdefault(m_for.mount_point, []).append(label)
    infos = [
        MountInfo(**{**i.__dict__, "holds": holds.get(i.mount_point, [])}) if i.mount_point in holds else i
        for i in infos
        # plumbing stays hidden unless asked for, or unless it holds a path asked about
        if include_internal or i.kind != "internal" or i.mount_point in holds
    ]
    # every folder of a recognised layout, including those that are not mounts of their own
    statuses: list[LayoutStatus] = []
    for platform in platforms:
        for lp in platform.paths:
            holder = mount_for(infos, lp.path)
            statuses.append(
                LayoutStatus(platform.name, lp.path, exists(lp.path), holder.mount_point if holder else None, lp)
            )
    return MountMap(mounts=infos, platforms=[p.name for p in platforms], layout=statuses)
