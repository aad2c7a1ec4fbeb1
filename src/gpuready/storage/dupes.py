"""Duplicate files: group by size, then by content, reading every byte of every candidate.

Content is the only proof of equality. A name (a Hugging Face blob's sha256 file name, an etag) says what a
file *should* hold, not what it holds: a corrupt blob keeps its name (issue 9). So every byte of every
candidate of a size group is read before it is grouped: files up to `SMALL` bytes in one read each, one size
group at a time in the scanning thread (no thread per small file: handing the interpreter lock around costs
more than reading a 4 KiB file), compared byte for byte (only duplicates are hashed, to name their group);
larger ones hashed in full (BLAKE3, 256 bits) after a head+tail filter, in a thread pool (the pipeline
fclones, czkawka and jdupes share; reference/storage.md §1a).

The scan keeps one packed record per file (inode, mtime_ns, folder index + name as bytes), so 200k
files cost about as much memory as jdupes' C structures (docs/storage_benchmark.md).

The scan and the reading are in storage/dupes_read.py; acting on duplicates (`make_plan`, `apply_plan`) in
storage/dedupe.py.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpuready.errors import InputError
from gpuready.storage.dupes_read import (
    _CHANGED,
    _REC,
    SMALL,
    Progress,
    _bounded,
    _cpus,
    _distinct_roots,
    _full,
    _Outcome,
    _partial,
    _read_small,
    _Scan,
    _scan,
    _SmallGroups,
)
from gpuready.storage.hashing import BLOCK

_FS_ENC, _FS_ERR = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # what os.fsdecode uses


@dataclass(frozen=True)
class Copy:
    """One path of a duplicate as the scan saw it: what `apply_plan` compares against right before acting."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int


class DupeGroup:
    """Files with identical content, one list of paths per inode (hard links together), sorted.

    Held as the scan's packed records (one per inode; an inode's other names in the scan's shared `links`) and
    turned into `Copy` objects or path strings only when asked, never kept: 20k groups of dataclasses cost
    more memory than the whole scan (docs/storage_benchmark.md). The records are put in path order once.
    """

    __slots__ = ("_devs", "_digest", "_dirs", "_links", "_ordered", "_recs", "size")

    def __init__(
        self,
        size: int,
        digest: bytes,
        recs: list[bytes],
        dirs: list[bytes],
        devs: list[int],
        links: dict[bytes, list[bytes]],
    ) -> None:
        self.size = size
        self._digest = digest  # BLAKE3 of the whole content, 32 bytes
        self._recs = recs  # one record per inode
        self._dirs = dirs
        self._devs = devs
        self._links = links  # record -> the inode's other names (hard links), for the few that have them
        self._ordered = False

    @property
    def digest(self) -> str:
        return "blake3:" + self._digest.hex()

    def _sorted(self) -> list[list[tuple[bytes, bytes]]]:
        """(path, record) per name: names in path order within an inode, inodes by their first path."""
        dirs = self._dirs
        links = self._links
        unpack = _REC.unpack_from
        skip = _REC.size
        out = [
            (sorted([(dirs[unpack(r)[2]] + b"/" + r[skip:], r) for r in (rec, *links.get(rec, ()))]), rec)
            for rec in self._recs
        ]
        if not self._ordered:
            out.sort()
            self._recs = [rec for _names, rec in out]  # the inode's record `links` knows, not its first name
            self._ordered = True
        return [names for names, _rec in out]

    @property
    def first(self) -> bytes:
        return self._sorted()[0][0][0]

    @classmethod
    def of(cls, size: int, digest: str, copies: list[list[Copy]]) -> DupeGroup:
        """A group made from paths (tests, callers with their own scan); `digest` is "blake3:<hex>"."""
        dirs: list[bytes] = []
        devs: list[int] = []
        recs: list[bytes] = []
        links: dict[bytes, list[bytes]] = {}
        for ino in copies:
            names = []
            for c in ino:
                d, name = os.path.split(os.fsencode(c.path))
                dirs.append(d)
                devs.append(c.dev)
                names.append(_REC.pack(c.ino, c.mtime_ns, len(dirs) - 1) + name)
            recs.append(names[0])
            if len(names) > 1:
                links[names[0]] = names[1:]
        return cls(size, bytes.fromhex(digest.removeprefix("blake3:")), recs, dirs, devs, links)

    @property
    def copies(self) -> list[list[Copy]]:
        out = []
        for ino in self._sorted():
            cs = []
            for path, r in ino:
                i, mtime, d = _REC.unpack_from(r)
                cs.append(Copy(path.decode(_FS_ENC, _FS_ERR), self._devs[d], i, self.size, mtime))
            out.append(cs)
        return out

    @property
    def inodes(self) -> list[list[str]]:
        return [[path.decode(_FS_ENC, _FS_ERR) for path, _r in ino] for ino in self._sorted()]

    @property
    def paths(self) -> list[str]:
        return [path.decode(_FS_ENC, _FS_ERR) for ino in self._sorted() for path, _r in ino]

    @property
    def reclaimable_bytes(self) -> int:  # size x (distinct inodes - 1); hard links already share their bytes
        return self.size * (len(self._recs) - 1)

    @property
    def n_inodes(self) -> int:
        return len(self._recs)

    def to_json(self) -> dict[str, Any]:
        inodes = self.inodes
        return {
            "size": self.size,
            "paths": [p for ino in inodes for p in ino],
            "inodes": inodes,
            "reclaimable_bytes": self.reclaimable_bytes,
            "digest": self.digest,
        }


@dataclass(frozen=True)
class DupesReport:
    roots: list[str]
    groups: list[DupeGroup]
    files_scanned: int
    bytes_scanned: int
    bytes_read: int  # what the scan actually read from disk
    candidates_after_size: int
    candidates_after_head_tail: int
    unreadable_dirs: list[str]
    unreadable_files: list[str]
    changed_files: list[str]  # modified between listing and hashing, or while hashed: reported, never grouped
    symlinks: list[str] = field(default_factory=list)  # symlinks met (not followed); their targets are protected
    scanned_at: float = 0.0  # time.monotonic() when the last file was hashed

    @property
    def reclaimable_bytes(self) -> int:
        return sum(g.reclaimable_bytes for g in self.groups)

    @property
    def symlinks_skipped(self) -> int:
        return len(self.symlinks)

    def to_json(self, groups: bool = True) -> dict[str, Any]:
        """The report as JSON data; `groups=False` leaves "groups" None (the CLI writes them one by one)."""
        return {
            "roots": self.roots,
            "groups": [g.to_json() for g in self.groups] if groups else None,
            "reclaimable_bytes": self.reclaimable_bytes,
            "files_scanned": self.files_scanned,
            "bytes_scanned": self.bytes_scanned,
            "bytes_read": self.bytes_read,
            "candidates_after_size": self.candidates_after_size,
            "candidates_after_head_tail": self.candidates_after_head_tail,
            "unreadable_dirs": self.unreadable_dirs,
            "unreadable_files": self.unreadable_files,
            "changed_files": self.changed_files,
            "symlinks_skipped": self.symlinks_skipped,
        }


@dataclass
class _Grouper:
    """Turns outcomes into groups; a record stands for its inode, `links` holds the inode's other names."""

    sc: _Scan
    links: dict[bytes, list[bytes]]
    groups: list[DupeGroup] = field(default_factory=list)
    bytes_read: int = 0
    unreadable: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    def names(self, rec: bytes) -> list[bytes]:
        return [rec, *self.links.get(rec, ())]

    def bucket(self, size: int, recs: list[bytes], outcomes: Iterator[_Outcome], read: int) -> dict[bytes, list[bytes]]:
        buckets: dict[bytes, list[bytes]] = {}
        for rec in recs:
            outcome = next(outcomes)
            if isinstance(outcome, bytes):
                self.bytes_read += read
                b = buckets.get(outcome)
                if b is None:
                    buckets[outcome] = [rec]
                else:
                    b.append(rec)
            else:
                bad = self.changed if outcome == _CHANGED else self.unreadable
                bad.extend(os.fsdecode(self.sc.path(r)) for r in self.names(rec))
        return buckets

    def settle_small(
        self, size: int, n: int, groups: _SmallGroups, changed: list[bytes], unreadable: list[bytes]
    ) -> None:
        """The outcome of `_small_groups` on `n` files of `size` bytes."""
        for bad, recs in ((self.changed, changed), (self.unreadable, unreadable)):
            bad.extend(os.fsdecode(self.sc.path(r)) for rec in recs for r in self.names(rec))
        self.bytes_read += size * (n - len(changed) - len(unreadable))
        for digest, recs in groups:
            self.groups.append(self._group(size, digest, recs))

    def emit(self, size: int, buckets: dict[bytes, list[bytes]]) -> None:
        for digest, recs in buckets.items():
            if len(recs) > 1:
                self.groups.append(self._group(size, digest, recs))

    def _group(self, size: int, digest: bytes, recs: list[bytes]) -> DupeGroup:
        return DupeGroup(size, digest, recs, self.sc.dirs, self.sc.devs, self.links)


def find_duplicates(
    roots: Sequence[str | os.PathLike[str]],
    *,
    min_size: int = 1,
    workers: int | None = None,
    progress: Progress | None = None,
) -> DupesReport:
    """Find groups of identical files under `roots`; every byte of every candidate is read and compared."""
    # The scan allocates a few objects per file and frees almost none of them until it ends, so the cyclic
    # garbage collector's passes find nothing and cost ~5% of the CPU time on 200k files; it is paused
    # meanwhile (reference counting still frees everything that is not a cycle) and restored after.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _find_duplicates(roots, min_size=min_size, workers=workers, progress=progress)
    finally:
        if was_enabled:
            gc.enable()


def _find_duplicates(
    roots: Sequence[str | os.PathLike[str]], *, min_size: int, workers: int | None, progress: Progress | None
) -> DupesReport:
    if not roots:
        raise InputError("PATH", "give at least one folder or file to scan")
    for r in roots:
        if not os.path.lexists(r):
            raise InputError("PATH", f"{os.fspath(r)!r} does not exist")
    if min_size < 0:
        raise InputError("--min-size", "must be 0 or more")
    sc = _scan(_distinct_roots(roots), min_size, progress)
    # a root that is a link to a file inside another root was merged away above; its target stays protected
    for r in roots:
        link = os.path.abspath(os.fspath(r))
        if os.path.islink(link) and not os.path.isdir(link) and link not in sc.symlinks:
            sc.symlinks.append(link)

    # size groups with at least two inodes; a record stands for its inode, its other names go to `links`
    links: dict[bytes, list[bytes]] = {}
    unpack = _REC.unpack_from
    devs = sc.devs
    small: list[tuple[int, list[bytes]]] = []
    large: list[tuple[int, list[bytes]]] = []
    for size, recs in sc.by_size.items():
        if len(recs) < 2:
            continue
        if len({rec[:8] for rec in recs}) == len(recs):  # distinct inode numbers: distinct files, the common case
            (small if size <= SMALL else large).append((size, recs))
            continue
        ids = {(ino, devs[idx]) for ino, _mtime, idx in map(unpack, recs)}  # (inode, device)
        if len(ids) < 2:
            continue
        if len(ids) < len(recs):
            first: dict[tuple[int, int], bytes] = {}
            for rec in recs:
                key = (unpack(rec)[0], devs[unpack(rec)[2]])
                if key in first:
                    links.setdefault(first[key], []).append(rec)
                else:
                    first[key] = rec
            recs = list(first.values())
        (small if size <= SMALL else large).append((size, recs))
    sc.by_size.clear()
    after_size = sum(len(r) for _, r in small) + sum(len(r) for _, r in large)
    g = _Grouper(sc, links)

    def path_of(rec: bytes, size: int) -> tuple[bytes, int, int, int]:
        ino, mtime, _i = _REC.unpack_from(rec)
        return (sc.path(rec), size, ino, mtime)

    _read_small(sc.dirs, small, g, workers or _cpus(), progress)
    n_workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=n_workers) as pool:
        # large files: head+tail blocks first (inline), then the survivors' full hashes in the pool
        full: list[tuple[int, list[bytes]]] = []
        for size, recs in large:
            parts = iter([_partial(*path_of(rec, size)) for rec in recs])
            buckets = g.bucket(size, recs, parts, 0)
            g.bytes_read += 2 * BLOCK * len(recs)
            full.extend((size, members) for members in buckets.values() if len(members) > 1)
        after_partial = sum(len(m) for _, m in full)
        total_full = sum(size * len(m) for size, m in full)
        done_bytes = 0
        flat = ((size, rec) for size, members in full for rec in members)
        outcomes_by_rec: dict[bytes, _Outcome] = {}
        for (size, rec), outcome in _bounded(pool, lambda x: _full(*path_of(x[1], x[0])), flat, 2 * n_workers):
            outcomes_by_rec[rec] = outcome
            done_bytes += size
            if progress is not None:
                progress("full hash", done_bytes, total_full)
        for size, members in full:
            g.emit(size, g.bucket(size, members, iter([outcomes_by_rec[r] for r in members]), size))

    g.groups.sort(key=lambda grp: (-grp.reclaimable_bytes, grp.first))
    return DupesReport(
        roots=[os.path.abspath(os.fspath(r)) for r in roots],
        groups=g.groups,
        files_scanned=sc.files,
        bytes_scanned=sc.total_bytes,
        bytes_read=g.bytes_read,
        candidates_after_size=after_size,
        candidates_after_head_tail=after_partial,
        unreadable_dirs=sc.unreadable_dirs,
        unreadable_files=sorted(g.unreadable),
        changed_files=sorted(g.changed),
        symlinks=sc.symlinks,
        scanned_at=time.monotonic(),
    )
