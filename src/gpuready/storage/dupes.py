"""Duplicate files: group by size, then by a hash of the head and tail blocks, then by a full hash, reading as
little as possible (the pipeline fclones, czkawka and jdupes share; reference/storage.md §1a).

Hard links to one inode are one file (nothing to reclaim). Hugging Face blobs (`models--*/blobs/<sha256>`) are
named by their content hash, so groups made only of such blobs need no reads at all; when they meet ordinary
files of the same size, the full stage uses SHA-256 so the blob names can stand in for reading the blobs.
"""

from __future__ import annotations

import functools
import os
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuready.errors import InputError
from gpuready.storage.hashing import BLOCK, Algorithm, FileChangedError, hash_file, head_tail_digest
from gpuready.storage.walk import FileEntry, WalkStats, walk_files

Progress = Callable[[str, int, int], None]  # (stage, done, total)

_SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")
_HF_REPO = re.compile(r"^(models|datasets|spaces)--")


def hf_blob_sha256(path: str) -> str | None:
    """The sha256 a Hugging Face hub-cache blob is named by, or None if `path` is not such a blob."""
    parent, name = os.path.split(path)
    repo_dir, blobs = os.path.split(parent)
    if blobs == "blobs" and _HF_REPO.match(os.path.basename(repo_dir)) and _SHA256_NAME.match(name):
        return name
    return None


@dataclass(frozen=True)
class DupeGroup:
    """Files with identical content. `paths` sorted, the first is the one a plan keeps."""

    size: int
    paths: list[str]
    reclaimable_bytes: int  # size x (distinct inodes - 1); hard links already share their bytes
    digest: str  # "blake3:<hex>" or "sha256:<hex>" of the whole content
    inodes: list[list[str]]  # paths grouped by inode (hard links together), same order as `paths`

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "paths": self.paths,
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
    hf_blobs_by_name: int  # files whose hash came from their Hugging Face blob name
    unreadable_dirs: list[str]
    unreadable_files: list[str]
    changed_files: list[str]  # modified while hashed: reported, never grouped
    symlinks_skipped: int

    @property
    def reclaimable_bytes(self) -> int:
        return sum(g.reclaimable_bytes for g in self.groups)

    def to_json(self) -> dict[str, Any]:
        return {
            "roots": self.roots,
            "groups": [g.to_json() for g in self.groups],
            "reclaimable_bytes": self.reclaimable_bytes,
            "files_scanned": self.files_scanned,
            "bytes_scanned": self.bytes_scanned,
            "bytes_read": self.bytes_read,
            "candidates_after_size": self.candidates_after_size,
            "candidates_after_head_tail": self.candidates_after_head_tail,
            "hf_blobs_by_name": self.hf_blobs_by_name,
            "unreadable_dirs": self.unreadable_dirs,
            "unreadable_files": self.unreadable_files,
            "changed_files": self.changed_files,
            "symlinks_skipped": self.symlinks_skipped,
        }


@dataclass
class _Inode:
    """One stored file: all its hard-linked paths."""

    entry: FileEntry
    paths: list[str] = field(default_factory=list)
    hf_sha256: str | None = None


# A worker's outcome: (digest, bytes read) or the kind of failure. Tallied in the calling thread.
_Outcome = tuple[str, int] | Literal["changed", "unreadable"]


@dataclass
class _Tally:
    bytes_read: int = 0
    unreadable: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    def add(self, node: _Inode, outcome: _Outcome) -> str | None:
        if outcome == "changed":
            self.changed.append(node.entry.path)
            return None
        if outcome == "unreadable":
            self.unreadable.extend(node.paths)
            return None
        digest, read = outcome
        self.bytes_read += read
        return digest


def find_duplicates(
    roots: Sequence[str | os.PathLike[str]],
    *,
    min_size: int = 1,
    trust_hf_names: bool = True,
    workers: int | None = None,
    progress: Progress | None = None,
) -> DupesReport:
    """Find groups of identical files under `roots`. Reads head+tail blocks only where sizes collide, and
    whole files only where heads and tails also agree."""
    if not roots:
        raise InputError("PATH", "give at least one folder or file to scan")
    for r in roots:
        if not os.path.lexists(r):
            raise InputError("PATH", f"{os.fspath(r)!r} does not exist")
    if min_size < 0:
        raise InputError("--min-size", "must be 0 or more")
    stats = WalkStats()
    by_size: dict[int, dict[tuple[int, int], _Inode]] = defaultdict(dict)
    seen_paths: set[str] = set()
    for entry in walk_files(roots, stats):
        if entry.size < min_size or entry.path in seen_paths:
            continue  # overlapping roots list a file once
        seen_paths.add(entry.path)
        if progress is not None and stats.files % 1000 == 0:
            progress("listing", stats.files, 0)
        inodes = by_size[entry.size]
        ident = (entry.dev, entry.ino)
        node = inodes.get(ident)
        if node is None:
            sha = hf_blob_sha256(entry.path) if trust_hf_names else None
            node = inodes[ident] = _Inode(entry, hf_sha256=sha)
        node.paths.append(entry.path)

    size_groups = [list(v.values()) for v in by_size.values() if len(v) > 1]
    tally = _Tally()
    groups: list[DupeGroup] = []
    after_size = sum(len(g) for g in size_groups)
    hf_by_name = 0

    # stage 2: head + tail blocks, only where some file of the size group is not a named HF blob
    need_partial = [g for g in size_groups if any(n.hf_sha256 is None for n in g)]
    for g in size_groups:
        if all(n.hf_sha256 is not None for n in g):
            hf_by_name += len(g)
            groups.extend(_groups_from_pairs([(n, f"sha256:{n.hf_sha256}") for n in g]))
    total_partial = sum(len(g) for g in need_partial)
    done = 0
    full_candidates: list[list[_Inode]] = []
    with ThreadPoolExecutor(max_workers=workers or min(8, (os.cpu_count() or 1) * 2)) as pool:
        for g in need_partial:
            outcomes = list(pool.map(_partial, g))
            done += len(g)
            if progress is not None:
                progress("head+tail", done, total_partial)
            buckets: dict[str, list[_Inode]] = defaultdict(list)
            for node, outcome in zip(g, outcomes, strict=True):
                key = tally.add(node, outcome)
                if key is not None:
                    buckets[key].append(node)
            for key, members in buckets.items():
                if len(members) < 2:
                    continue
                if members[0].entry.size <= 2 * BLOCK:  # the head+tail read was the whole file
                    groups.extend(_groups_from_pairs([(n, f"blake3:{key}") for n in members]))
                else:
                    full_candidates.append(members)
        after_partial = sum(len(g) for g in full_candidates)

        # stage 3: full hash; sha256 when a named HF blob is in the bucket (its name is its sha256)
        total_full = sum(n.entry.size for g in full_candidates for n in g if n.hf_sha256 is None)
        done_bytes = 0
        for members in full_candidates:
            algo: Algorithm = "sha256" if any(n.hf_sha256 for n in members) else "blake3"
            hf_by_name += sum(1 for n in members if n.hf_sha256)
            outcomes = list(pool.map(functools.partial(_full, algorithm=algo), members))
            done_bytes += sum(n.entry.size for n in members if n.hf_sha256 is None)
            if progress is not None:
                progress("full hash", done_bytes, total_full)
            pairs: list[tuple[_Inode, str]] = []
            for node, outcome in zip(members, outcomes, strict=True):
                digest = tally.add(node, outcome)
                if digest is not None:
                    pairs.append((node, digest))
            groups.extend(_groups_from_pairs(pairs))

    groups.sort(key=lambda g: (-g.reclaimable_bytes, g.paths[0]))
    return DupesReport(
        roots=[os.path.abspath(os.fspath(r)) for r in roots],
        groups=groups,
        files_scanned=stats.files,
        bytes_scanned=stats.bytes,
        bytes_read=tally.bytes_read,
        candidates_after_size=after_size,
        candidates_after_head_tail=after_partial,
        hf_blobs_by_name=hf_by_name,
        unreadable_dirs=stats.unreadable_dirs,
        unreadable_files=sorted(tally.unreadable),
        changed_files=sorted(tally.changed),
        symlinks_skipped=stats.symlinks_skipped,
    )


def _partial(node: _Inode) -> _Outcome:
    try:
        d = head_tail_digest(node.entry.path, node.entry.size)
    except FileChangedError:
        return "changed"
    except OSError:
        return "unreadable"
    return (d.hexdigest, d.bytes_read)


def _full(node: _Inode, algorithm: Algorithm) -> _Outcome:
    if node.hf_sha256 is not None:
        return (f"sha256:{node.hf_sha256}", 0)
    try:
        d = hash_file(node.entry.path, algorithm)
    except FileChangedError:
        return "changed"
    except OSError:
        return "unreadable"
    return (f"{algorithm}:{d.hexdigest}", d.bytes_read)


def _groups_from_pairs(pairs: list[tuple[_Inode, str]]) -> list[DupeGroup]:
    by_digest: dict[str, list[_Inode]] = defaultdict(list)
    for node, digest in pairs:
        by_digest[digest].append(node)
    out: list[DupeGroup] = []
    for digest, nodes in by_digest.items():
        if len(nodes) < 2:
            continue
        inodes = sorted(sorted(n.paths) for n in nodes)
        out.append(
            DupeGroup(
                size=nodes[0].entry.size,
                paths=[p for paths in inodes for p in paths],
                reclaimable_bytes=nodes[0].entry.size * (len(nodes) - 1),
                digest=digest,
                inodes=inodes,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------------
# Acting on duplicates: a plan first (shown, --dry-run), then `apply_plan` only when the user said --yes.

Action = Literal["remove", "hardlink"]


@dataclass(frozen=True)
class PlanStep:
    path: str  # the copy that goes away (removed, or replaced by a hard link to `keep`)
    keep: str
    size: int
    mtime_ns: int  # as scanned: a file modified since the scan is skipped, never acted on
    ino: int


@dataclass(frozen=True)
class DedupePlan:
    action: Action
    steps: list[PlanStep]

    @property
    def reclaimable_bytes(self) -> int:
        return sum(s.size for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "reclaimable_bytes": self.reclaimable_bytes,
            "steps": [{"path": s.path, "keep": s.keep, "size": s.size} for s in self.steps],
        }


@dataclass(frozen=True)
class ApplyResult:
    done: list[str]
    skipped: list[tuple[str, str]]  # (path, why)
    freed_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "freed_bytes": self.freed_bytes,
        }


def make_plan(report: DupesReport, action: str) -> DedupePlan:
    """Keep the first path of each group (sorted); every other inode is removed or hard-linked to it.
    Extra hard links of an inode that goes away are acted on too, or its bytes would stay on disk."""
    if action not in ("remove", "hardlink"):
        raise InputError("--action", f"{action!r}; allowed: remove, hardlink")
    steps: list[PlanStep] = []
    for g in report.groups:
        keep = g.inodes[0][0]
        for paths in g.inodes[1:]:
            for p in paths:
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                steps.append(PlanStep(p, keep, g.size, st.st_mtime_ns, st.st_ino))
    return DedupePlan(action, steps)  # type: ignore[arg-type]


def apply_plan(plan: DedupePlan) -> ApplyResult:
    """Carry out a plan. Each step re-checks that the file is still the one scanned (inode, size, mtime)
    and that the kept copy still exists; a hard link is made under a temporary name, then renamed over."""
    done: list[str] = []
    skipped: list[tuple[str, str]] = []
    freed = 0
    for step in plan.steps:
        try:
            st = os.lstat(step.path)
            keep_st = os.stat(step.keep)
        except OSError as exc:
            skipped.append((step.path, f"cannot stat: {exc.strerror or exc}"))
            continue
        if (st.st_ino, st.st_size, st.st_mtime_ns) != (step.ino, step.size, step.mtime_ns):
            skipped.append((step.path, "changed since the scan"))
            continue
        if keep_st.st_size != step.size:
            skipped.append((step.path, f"kept copy {step.keep} changed since the scan"))
            continue
        if keep_st.st_ino == st.st_ino and keep_st.st_dev == st.st_dev:
            skipped.append((step.path, "already a hard link of the kept copy"))
            continue
        try:
            if plan.action == "remove":
                os.unlink(step.path)
            else:
                if keep_st.st_dev != st.st_dev:
                    skipped.append((step.path, "on another filesystem; a hard link cannot cross it"))
                    continue
                tmp = f"{step.path}.gpuready-link-{os.getpid()}"
                os.link(step.keep, tmp)
                os.replace(tmp, step.path)
        except OSError as exc:
            skipped.append((step.path, exc.strerror or str(exc)))
            continue
        done.append(step.path)
        if st.st_nlink <= 1:  # the last name of that inode: its blocks are free now
            freed += step.size
    return ApplyResult(done, skipped, freed)
