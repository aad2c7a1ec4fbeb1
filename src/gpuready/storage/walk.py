"""Walking folders the safe way: symlinks are never followed out of the tree, unreadable folders are
skipped and counted, special files (fifos, sockets, devices) are never opened."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FileEntry:
    """One regular file as the walk saw it. `path` is absolute; `rel` relative to its root, `/`-separated."""

    path: str
    rel: str
    size: int
    dev: int
    ino: int
    mtime_ns: int
    via_symlink: bool = False


@dataclass
class WalkStats:
    """What the walk skipped, so a report can say it (unknown is a value, not a silent gap)."""

    files: int = 0
    bytes: int = 0
    unreadable_dirs: list[str] = field(default_factory=list)
    symlinks_skipped: int = 0
    special_skipped: int = 0


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def walk_files(
    roots: Iterable[str | os.PathLike[str]],
    stats: WalkStats,
    *,
    follow_symlinks_in_tree: bool = False,
    exclude: frozenset[str] = frozenset(),
    scandir: Callable[[str], Any] = os.scandir,
) -> Iterator[FileEntry]:
    """Yield every regular file under `roots` (a root may itself be a file).

    Symlinks are skipped and counted, except with `follow_symlinks_in_tree`, where a link whose real target
    is a regular file inside the same root is yielded under the link's name (what `b3sum -c` would read).
    Links to folders are never entered, so a walk cannot loop or leave the tree. `scandir` is injectable
    so tests can make a folder unreadable even when they run as root.
    """
    for root_arg in roots:
        root = os.path.abspath(os.fspath(root_arg))
        real_root = os.path.realpath(root)
        try:
            st = os.lstat(root)
        except OSError:
            stats.unreadable_dirs.append(root)
            continue
        if stat.S_ISREG(st.st_mode):
            stats.files += 1
            stats.bytes += st.st_size
            yield FileEntry(root, os.path.basename(root), st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns)
            continue
        stack = [root]
        while stack:
            folder = stack.pop()
            try:
                with scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                stats.unreadable_dirs.append(folder)
                continue
            subdirs: list[str] = []
            for entry in entries:
                if entry.path in exclude:
                    continue
                try:
                    if entry.is_symlink():
                        found = None
                        if follow_symlinks_in_tree:
                            found = _in_tree_link(entry.path, real_root, root)
                        if found is None:
                            stats.symlinks_skipped += 1
                            continue
                        yield _counted(found, stats)
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.path)
                        continue
                    est = entry.stat(follow_symlinks=False)
                except OSError:
                    stats.special_skipped += 1
                    continue
                if not stat.S_ISREG(est.st_mode):
                    stats.special_skipped += 1
                    continue
                rel = os.path.relpath(entry.path, root).replace(os.sep, "/")
                yield _counted(FileEntry(entry.path, rel, est.st_size, est.st_dev, est.st_ino, est.st_mtime_ns), stats)
            stack.extend(reversed(subdirs))


def _counted(entry: FileEntry, stats: WalkStats) -> FileEntry:
    stats.files += 1
    stats.bytes += entry.size
    return entry


def _in_tree_link(link: str, real_root: str, root: str) -> FileEntry | None:
    target = os.path.realpath(link)
    if not _inside(target, real_root):
        return None
    try:
        st = os.stat(target)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    rel = os.path.relpath(link, root).replace(os.sep, "/")
    return FileEntry(link, rel, st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, via_symlink=True)
