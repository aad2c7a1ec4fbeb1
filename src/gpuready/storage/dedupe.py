"""Acting on duplicates: a plan (`make_plan`) and its application (`apply_plan`) for the groups storage/dupes.py
finds. Knows what a Hugging Face cache and a git repository are, never removes a file that a symlink or a snapshot
points at, re-checks both copies right before each action and acts atomically (a hard link under a temporary name
in the same folder, renamed over).
"""

from __future__ import annotations

import os
import stat
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuready.errors import InputError
from gpuready.storage.dupes import Copy, DupesReport
from gpuready.storage.hashing import hash_file

RECHECK_AFTER_S = 3.0  # a plan applied later than this after the scan re-hashes both copies first


# What must not be removed: Hugging Face cache blobs, git object stores, targets of symlinks.

Protection = Literal["never", "link-only"]
_HF_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


def _git_part(parts: list[str]) -> int | None:
    for i, p in enumerate(parts[:-1]):
        if p == ".git" or (p.endswith(".git") and p != ".git" and i + 1 < len(parts) and parts[i + 1] == "objects"):
            return i
    return None


def protection(path: str, symlink_targets: dict[str, int]) -> tuple[Protection, str] | None:
    """Why `path` may not be removed (and whether it may at least be replaced by a hard link), or None."""
    parts = path.split("/")
    g = _git_part(parts)
    if g is not None:
        if "objects" in parts[g + 1 : -1]:
            return (
                "link-only",
                "git object store: removing it breaks the repository (`git log` fails); a hard link is what "
                "`git clone --local` makes, or share objects with `git clone --reference OTHER`",
            )
        return ("never", "git metadata (.git): never changed")
    repo = next((i for i, p in enumerate(parts[:-1]) if p.startswith(_HF_REPO_PREFIXES)), None)
    if repo is not None and repo + 2 <= len(parts) - 1:
        # huggingface_hub's cache layout: <repo>/blobs/<hash>, <repo>/snapshots/<rev>/..., <repo>/refs/<branch>
        # (huggingface_hub `file_download.py`, docs "Understand caching")
        area = parts[repo + 1]
        if area == "blobs":
            return (
                "link-only",
                "Hugging Face cache blob: snapshot links point at it by name; replaced by a hard link, never removed",
            )
        if area == "snapshots":
            return ("link-only", "Hugging Face cache snapshot file: the cache reads it by this name")
        return ("never", f"Hugging Face cache {area}/ (branch and revision bookkeeping): never changed")
    n = symlink_targets.get(path)
    if n:
        return ("link-only", f"{n} symlink(s) point at it; removing it would leave them dangling")
    return None


def symlink_targets(links: Sequence[str]) -> dict[str, int]:
    """Real path -> number of the given symlinks that resolve to it (loops and dangling links resolve to none)."""
    out: dict[str, int] = defaultdict(int)
    for link in links:
        try:
            target = os.path.realpath(link, strict=True)
        except (OSError, RuntimeError):
            continue
        out[target] += 1
    return dict(out)


# ---------------------------------------------------------------------------------------------------------
# Acting on duplicates: a plan first (shown, --dry-run), then `apply_plan` only when the user said --yes.

Action = Literal["remove", "hardlink"]


@dataclass(frozen=True)
class PlanStep:
    action: Action
    path: str  # the copy that goes away (removed, or replaced by a hard link to `keep`)
    keep: str
    size: int
    scanned: Copy  # `path` as the scan saw it
    kept: Copy  # `keep` as the scan saw it
    digest: str
    note: str = ""

    @property
    def mtime_ns(self) -> int:
        return self.scanned.mtime_ns

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "path": self.path, "keep": self.keep, "size": self.size, "note": self.note}


@dataclass(frozen=True)
class Protected:
    path: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class DedupePlan:
    action: Action
    steps: list[PlanStep]
    protected: list[Protected]  # files left alone, with why
    scanned_at: float  # monotonic time of the scan the plan was made from

    @property
    def reclaimable_bytes(self) -> int:
        return sum(s.size for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "reclaimable_bytes": self.reclaimable_bytes,
            "steps": [s.to_json() for s in self.steps],
            "protected": [p.to_json() for p in self.protected],
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
    """Per group keep one inode and remove or hard-link every other one.

    The kept copy is a protected file when the group has one (a Hugging Face blob, a git object, a symlink's
    target), so the copies acted on are the ordinary ones. A protected file is never removed: under
    `remove` it is replaced by a hard link to the kept copy instead (snapshot links and `git log` keep
    working, the bytes are freed all the same); git metadata outside `objects/` is never touched. Extra hard
    links of an inode that goes away are acted on too, or its bytes would stay on disk.
    """
    if action not in ("remove", "hardlink"):
        raise InputError("--action", f"{action!r}; allowed: remove, hardlink")
    targets = symlink_targets(report.symlinks)
    steps: list[PlanStep] = []
    protected: list[Protected] = []
    rank = {"never": 0, "link-only": 1, None: 2}
    for g in report.groups:
        prot = {c.path: protection(c.path, targets) for ino in g.copies for c in ino}

        def order(ino: list[Copy], prot: dict[str, tuple[Protection, str] | None] = prot) -> tuple[int, str]:
            return (min(rank[p[0] if (p := prot[c.path]) else None] for c in ino), ino[0].path)

        inodes = sorted(g.copies, key=order)
        kept = inodes[0][0]  # a protected copy when there is one: it stays as it is
        for ino in inodes[1:]:
            kinds = {p[0] for c in ino if (p := prot[c.path])}
            if "never" in kinds:
                for c in ino:
                    p = prot[c.path]
                    protected.append(Protected(c.path, p[1] if p else "a hard link of a file never changed"))
                continue
            for c in ino:
                p = prot[c.path]
                step_action: Action = action  # type: ignore[assignment]
                note = ""
                if p is not None and action == "remove":
                    step_action, note = "hardlink", p[1]
                if step_action == "hardlink" and c.dev != kept.dev:
                    protected.append(
                        Protected(
                            c.path,
                            "on another filesystem than the kept copy: a hard link "
                            "cannot cross it" + (f"; {p[1]}" if p else ""),
                        )
                    )
                    continue
                if p is not None and not note:
                    note = p[1]
                steps.append(PlanStep(step_action, c.path, kept.path, g.size, c, kept, g.digest, note))
    return DedupePlan(action, steps, protected, report.scanned_at)  # type: ignore[arg-type]


Hook = Callable[[PlanStep], None]


def _same(st: os.stat_result, c: Copy) -> bool:
    return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (
        c.dev,
        c.ino,
        c.size,
        c.mtime_ns,
    )


def _content(path: str, c: Copy) -> str | None:
    try:
        return "blake3:" + hash_file(path, "blake3", expect=(c.size, c.mtime_ns, c.ino)).hexdigest
    except OSError:
        return None


def _tmp_name(path: str, tag: str) -> str:
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name[:100]}.gpuready-{tag}-{os.getpid()}-{time.monotonic_ns()}")


def apply_plan(
    plan: DedupePlan,
    *,
    recheck_after: float = RECHECK_AFTER_S,
    clock: Callable[[], float] = time.monotonic,
    before_step: Hook | None = None,
    before_commit: Hook | None = None,
) -> ApplyResult:
    """Carry out a plan, step by step, each re-checked right before it acts.

    Both copies must still be the files the scan read (device, inode, size, mtime_ns); when the scan is older
    than `recheck_after` seconds both are also re-hashed in full. A hard link is made under a temporary name
    in the path's folder and renamed over the path; a removal first renames the path aside, checks the
    renamed file is still the scanned one, then unlinks it. Anything that changed is skipped and reported.
    `before_step` / `before_commit` are test hooks: they run after the scan and before the check, and between
    the check and the rename.
    """
    done: list[str] = []
    skipped: list[tuple[str, str]] = []
    freed = 0
    for step in plan.steps:
        if before_step is not None:
            before_step(step)
        try:
            st = os.lstat(step.path)
        except OSError as exc:
            skipped.append((step.path, f"cannot stat: {exc.strerror or exc}"))
            continue
        try:
            keep_st = os.lstat(step.keep)
        except OSError as exc:
            skipped.append((step.path, f"kept copy {step.keep}: {exc.strerror or exc}"))
            continue
        if keep_st.st_dev == st.st_dev and keep_st.st_ino == st.st_ino:
            skipped.append((step.path, "already a hard link of the kept copy"))
            continue
        if not _same(st, step.scanned):
            skipped.append((step.path, "changed since the scan"))
            continue
        if not _same(keep_st, step.kept):
            skipped.append((step.path, f"kept copy {step.keep} changed since the scan"))
            continue
        if clock() - plan.scanned_at > recheck_after:
            if _content(step.keep, step.kept) != step.digest:
                skipped.append((step.path, f"kept copy {step.keep} no longer holds the scanned content"))
                continue
            if _content(step.path, step.scanned) != step.digest:
                skipped.append((step.path, "content changed since the scan"))
                continue
        try:
            if step.action == "hardlink":
                ok, why = _link_over(step, before_commit)
            else:
                ok, why = _remove(step, before_commit)
        except OSError as exc:
            ok, why = False, exc.strerror or str(exc)
        if not ok:
            skipped.append((step.path, why))
            continue
        done.append(step.path)
        if st.st_nlink <= 1:  # the last name of that inode: its blocks are free now
            freed += step.size
    return ApplyResult(done, skipped, freed)


def _link_over(step: PlanStep, hook: Hook | None) -> tuple[bool, str]:
    tmp = _tmp_name(step.path, "link")
    os.link(step.keep, tmp, follow_symlinks=False)
    try:
        tst = os.lstat(tmp)
        if not _same(tst, step.kept):
            return False, f"kept copy {step.keep} changed while linking"
        if hook is not None:
            hook(step)
        if not _same(os.lstat(step.path), step.scanned):
            return False, "changed since the scan"
        os.replace(tmp, step.path)
        tmp = ""
    finally:
        if tmp:
            os.unlink(tmp)
    return True, ""


def _remove(step: PlanStep, hook: Hook | None) -> tuple[bool, str]:
    if not _same(os.lstat(step.keep), step.kept):
        return False, f"kept copy {step.keep} changed since the scan"
    tmp = _tmp_name(step.path, "rm")
    if hook is not None:
        hook(step)
    os.rename(step.path, tmp)
    if _same(os.lstat(tmp), step.scanned) and _same(os.lstat(step.keep), step.kept):
        os.unlink(tmp)
        return True, ""
    # put it back: link (never overwrites a file created meanwhile), then drop the aside name
    try:
        os.link(tmp, step.path)
    except OSError:
        return False, f"changed since the scan; left under {tmp}"
    os.unlink(tmp)
    return False, "changed since the scan"
