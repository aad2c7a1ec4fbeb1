"""`gpuready sync SRC DEST`: copy with rsync (rclone for rclone remotes), then prove the copy by reading it.

rsync verifies each file it *transfers* with a whole-file checksum, but says nothing about files its quick
check (size + mtime) skipped, and `--checksum` only changes that pre-transfer test (RsyncProject/rsync
`rsync.1.md`). So after the copy: a local destination is re-read against a manifest of the source (written
into DEST as `.gpuready-manifest.b3`, which `b3sum -c` also accepts); an ssh destination is compared with
`rsync --checksum --dry-run --itemize-changes`; an rclone remote with `rclone check --one-way`.

Interrupted copies resume: rsync runs with `--partial` (partially sent files are kept) and a re-run skips
every file already complete, then verifies everything again.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpuready.errors import GpureadyError, InputError
from gpuready.storage.manifest import ByteProgress, VerifyResult, create_manifest, verify_manifest
from gpuready.storage.runner import Runner, RunResult
from gpuready.storage.walk import WalkStats, walk_files

MANIFEST_NAME = ".gpuready-manifest.b3"
Target = Literal["local", "ssh", "rclone"]
_PROGRESS2 = re.compile(r"^\s*([\d,.]+)\s+(\d+)%")
_REMOTE = re.compile(r"^([A-Za-z0-9_.@-]+):")


def target_kind(dest: str, runner: Runner, timeout: float = 30) -> Target:
    """rclone when DEST starts with a configured rclone remote name, ssh for `host:path`, else local."""
    match = _REMOTE.match(dest)
    if match is None or os.path.isabs(dest) or dest.startswith("."):
        return "local"
    name = match.group(1)
    if runner.which("rclone"):
        res = runner.run(["rclone", "listremotes"], timeout=timeout)
        if res.returncode == 0 and f"{name}:" in res.stdout.split():
            return "rclone"
    return "ssh"


@dataclass(frozen=True)
class SyncResult:
    src: str
    dest: str
    target: Target
    tool: str
    argv: list[str]
    copied: bool
    returncode: int
    verified: bool
    message: str
    source_files: int
    source_bytes: int
    differences: list[str] = field(default_factory=list)  # ssh/rclone verify: paths that differ or miss
    verify: VerifyResult | None = None
    manifest: str | None = None
    copy_seconds: float = 0.0
    interrupted: bool = False  # Ctrl-C / SIGTERM: rsync was stopped with gpuready
    complete_files: int | None = None  # local DEST after an interruption: files already equal (size + mtime)
    complete_bytes: int | None = None
    error_line: str = ""  # the copy tool's own error message
    fix: str = ""  # what to do about that error
    notes: list[str] = field(default_factory=list)  # what the tool cannot keep (rclone: hard links, holes)
    to_delete: list[str] = field(default_factory=list)  # --delete without --yes: what would be deleted

    @property
    def ok(self) -> bool:
        return self.copied and self.verified

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "src": self.src,
            "dest": self.dest,
            "target": self.target,
            "tool": self.tool,
            "argv": self.argv,
            "copied": self.copied,
            "returncode": self.returncode,
            "verified": self.verified,
            "message": self.message,
            "source_files": self.source_files,
            "source_bytes": self.source_bytes,
            "differences": self.differences,
            "verify": self.verify.to_json() if self.verify else None,
            "manifest": self.manifest,
            "copy_seconds": round(self.copy_seconds, 3),
            "interrupted": self.interrupted,
            "complete_files": self.complete_files,
            "complete_bytes": self.complete_bytes,
            "error_line": self.error_line,
            "fix": self.fix,
            "notes": self.notes,
            "to_delete": self.to_delete,
        }


_EXCLUDES = [f"--exclude=/{MANIFEST_NAME}", f"--exclude=/{MANIFEST_NAME}.json"]


def rsync_argv(
    src: str, dest: str, *, checksum: bool = False, dry_run: bool = False, delete: bool = False, bwlimit: str = ""
) -> list[str]:
    """-a plus -H (hard links stay links: without it every name becomes a full copy) and -S (holes of sparse
    files stay holes), --partial so an interrupted copy resumes (rsync(1))."""
    argv = ["rsync", "-aHS", "--partial", "--info=progress2", "--no-inc-recursive"]
    if checksum:
        argv.append("--checksum")
    if dry_run:
        argv.append("--dry-run")
    if delete:
        argv.append("--delete")
    if bwlimit:
        argv.append(f"--bwlimit={bwlimit}")
    argv += _EXCLUDES
    return [*argv, src.rstrip("/") + "/", dest.rstrip("/") + "/"]


def _progress_parser(total: int, progress: ByteProgress | None) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        m = _PROGRESS2.match(line)
        if m and progress is not None:
            progress(int(m.group(1).replace(",", "").replace(".", "")), total)

    return on_line


def _tail(res: RunResult) -> str:
    text = (res.stderr or res.stdout).strip().splitlines()
    return text[-1] if text else ""


# (pattern in the tool's message, the fix): rsync/ssh/rclone messages as they print them
_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"could not resolve|name or service not known|temporary failure in name resolution|"
            r"no address associated|nodename nor servname",
            re.I,
        ),
        "the host name does not resolve: check its spelling, an entry in ~/.ssh/config, or use the IP address",
    ),
    (
        re.compile(r"permission denied|operation not permitted|read-only file system", re.I),
        "permission denied: check that you may write DEST (and read SRC); for ssh, that your key is accepted "
        "(ssh HOST true)",
    ),
    (
        re.compile(r"no space left on device|disk quota exceeded|file too large", re.I),
        "DEST is full: free space there (gpuready storage DEST shows the mount and its free space) or copy to "
        "another disk; run again to resume",
    ),
    (
        re.compile(
            r"connection refused|connection timed out|connection reset|no route to host|"
            r"connection closed|broken pipe",
            re.I,
        ),
        "the connection failed: check that the host is up and reachable (ssh HOST true); run again to resume",
    ),
)


def explain_error(res: RunResult) -> tuple[str, str]:
    """The tool's own error line (the most specific one it printed) and a fix for its cause."""
    lines = [ln.strip() for ln in (res.stderr + "\n" + res.stdout).splitlines() if ln.strip()]
    specific = [ln for ln in lines if ln.startswith(("rsync:", "ssh:", "rsync error:")) or "ERROR" in ln]
    first = next((ln for ln in specific if not ln.startswith("rsync error:")), "")
    line = first or (specific[-1] if specific else (lines[-1] if lines else ""))
    text = "\n".join(lines)
    for pattern, fix in _CAUSES:
        if pattern.search(text):
            return line, fix
    return line, "run the same command again to resume; rsync keeps what it already copied"


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def check_not_nested(src: str, dest: str) -> None:
    """Refuse DEST inside SRC (each run would copy the last copy into itself) and SRC inside DEST (a --delete
    would remove the source); symlinks resolved, so a link cannot hide it. Nothing is created before this."""
    s, d = os.path.realpath(src), os.path.realpath(dest)
    if _inside(d, s):
        raise InputError("DEST", f"{dest!r} is inside SRC {src!r} (after resolving links); choose a folder outside it")
    if _inside(s, d):
        raise InputError("DEST", f"SRC {src!r} is inside DEST {dest!r}; choose a folder that does not contain SRC")


def _complete_in_dest(src: str, dest: str) -> tuple[int, int]:
    """Files of SRC already in DEST with the same size and mtime (what rsync -a's quick check calls done)."""
    files = done_bytes = 0
    stats = WalkStats()
    for e in walk_files([src], stats):
        try:
            st = os.lstat(os.path.join(dest, e.rel))
        except OSError:
            continue
        if st.st_size == e.size and st.st_mtime_ns // 10**9 == e.mtime_ns // 10**9:
            files += 1
            done_bytes += e.size
    return files, done_bytes


def sync(
    src: str,
    dest: str,
    *,
    runner: Runner,
    timeout: float = 24 * 3600,
    checksum: bool = False,
    dry_run: bool = False,
    delete: bool = False,
    yes: bool = False,
    bwlimit: str = "",
    copy_progress: ByteProgress | None = None,
    verify_progress: ByteProgress | None = None,
) -> SyncResult:
    """Copy SRC (a folder) to DEST and verify DEST. Faults (tool missing, copy interrupted, verify failed)
    come back in the result; only bad input raises. `delete` (rsync --delete) removes files of DEST that SRC
    does not have: without `yes` nothing is copied, and the files it would delete are listed."""
    if not os.path.isdir(src):
        raise InputError("SRC", f"{src!r} is not a folder")
    if timeout <= 0:
        raise InputError("--timeout", "must be a positive number of seconds")
    if bwlimit and not re.fullmatch(r"\d+(\.\d+)?[KMGkmg]?", bwlimit):
        raise InputError("--bwlimit", f"{bwlimit!r}; give a rate such as 500K or 20M (bytes per second)")
    kind = target_kind(dest, runner)
    if kind == "local":
        check_not_nested(src, dest)
    stats = WalkStats()
    own = frozenset(os.path.join(os.path.abspath(src), n) for n in _OWN_NAMES)
    for _ in walk_files([src], stats, follow_symlinks_in_tree=True, exclude=own):
        pass
    tool = "rclone" if kind == "rclone" else "rsync"
    if runner.which(tool) is None:
        raise GpureadyError(f"{tool} is not installed; install it (apt-get install {tool}) and run again")
    notes: list[str] = []
    if kind == "rclone":
        notes.append(
            "rclone copies each hard-linked name as a full copy and writes sparse files' holes as zeros "
            "(it has no -H/-S); rsync keeps both"
        )
        if delete:
            raise InputError("--delete", "is for rsync targets; with rclone use `rclone sync` yourself")
        argv = ["rclone", "copy", src, dest]
        if dry_run:
            argv.append("--dry-run")
        res = runner.run(argv, timeout=timeout, ours=True)
    else:
        to_delete: list[str] = []
        if delete and not yes and not dry_run:
            listing = rsync_argv(src, dest, dry_run=True, delete=True)
            listing.insert(1, "--itemize-changes")
            probe = runner.run(listing, timeout=timeout) if kind != "local" or os.path.isdir(dest) else None
            if probe is not None:
                # itemized deletions: "*deleting" padded to the 11-column %i field, a space, the name
                to_delete = [ln[12:] for ln in probe.stdout.split("\n") if ln.startswith("*deleting ")]
            return SyncResult(
                src=os.path.abspath(src),
                dest=dest if kind != "local" else os.path.abspath(dest),
                target=kind,
                tool=tool,
                argv=listing,
                copied=False,
                returncode=0,
                verified=False,
                message=f"--delete would delete {len(to_delete)} file(s) in DEST that SRC does not have; "
                "nothing changed; add --yes to copy and delete",
                source_files=stats.files,
                source_bytes=stats.bytes,
                to_delete=to_delete,
            )
        if kind == "local" and not dry_run:
            os.makedirs(dest, exist_ok=True)
        argv = rsync_argv(src, dest, checksum=checksum, dry_run=dry_run, delete=delete, bwlimit=bwlimit)
        res = runner.run(argv, timeout=timeout, on_line=_progress_parser(stats.bytes, copy_progress), ours=True)
    base = SyncResult(
        src=os.path.abspath(src),
        dest=dest if kind != "local" else os.path.abspath(dest),
        target=kind,
        tool=tool,
        argv=argv,
        copied=False,
        returncode=res.returncode,
        verified=False,
        message="",
        source_files=stats.files,
        source_bytes=stats.bytes,
        copy_seconds=res.seconds,
        notes=notes,
        interrupted=res.interrupted,
    )
    if res.interrupted:
        done = _complete_in_dest(src, dest) if kind == "local" and os.path.isdir(dest) else None
        what = f"{done[0]} of {stats.files} files are complete in DEST" if done else "what reached DEST is unknown"
        return replace(
            base,
            complete_files=done[0] if done else None,
            complete_bytes=done[1] if done else None,
            message=f"interrupted; {tool} stopped; {what}; run the same command again to resume",
        )
    if res.returncode != 0 or res.timed_out:
        line, fix = explain_error(res)
        why = "timed out" if res.timed_out else f"{tool} exited {res.returncode}"
        done = _complete_in_dest(src, dest) if kind == "local" and os.path.isdir(dest) else None
        return replace(
            base,
            error_line=line,
            fix=fix,
            complete_files=done[0] if done else None,
            complete_bytes=done[1] if done else None,
            message=f"copy incomplete ({why}): {line}" if line else f"copy incomplete ({why})",
        )
    if dry_run:
        return replace(base, message="dry run: nothing copied")
    if kind == "local":
        manifest = os.path.join(dest, MANIFEST_NAME)
        # the manifest names what SRC holds (never a manifest an earlier hop left in SRC); DEST is read
        # against it, so files DEST already had are listed as extra and fail only with --delete
        made = create_manifest(
            src, manifest, record_root=dest, progress=verify_progress, exclude_rel=frozenset(_OWN_NAMES)
        )
        check = verify_manifest(manifest, dest, progress=verify_progress, extra_fails=delete)
        problems = made.changed_files + made.unreadable_files
        ok = check.ok and not problems
        if ok:
            msg = f"copied and verified {check.checked} files"
            if check.extra:
                msg += f"; {len(check.extra)} file(s) in DEST are not from SRC (kept, listed)"
        elif problems:
            msg = f"source files changed or unreadable while hashed: {', '.join(problems[:5])}"
        else:
            msg = (
                "verification failed: DEST differs from SRC; run again with --checksum to re-copy every file "
                "whose content differs"
            )
        return replace(base, copied=True, verified=ok, message=msg, verify=check, manifest=manifest)
    diffs = _remote_differences(kind, src, dest, runner, timeout)
    msg = "copied and verified" if not diffs else f"{len(diffs)} path(s) differ after the copy"
    return replace(base, copied=True, verified=not diffs, message=msg, differences=diffs)


_OWN_NAMES = (MANIFEST_NAME, f"{MANIFEST_NAME}.json")


def _remote_differences(kind: Target, src: str, dest: str, runner: Runner, timeout: float) -> list[str]:
    """Paths that differ between SRC and a remote DEST, both sides read in full by the tool."""
    if kind == "rclone":
        res = runner.run(["rclone", "check", src, dest, "--one-way", "--combined", "-"], timeout=timeout)
        diffs = [line[2:] for line in res.stdout.splitlines() if line[:2] in ("+ ", "* ", "! ", "- ")]
        if res.returncode != 0 and not diffs:
            diffs = [f"(rclone check exited {res.returncode}: {_tail(res)})"]
        return diffs
    argv = ["rsync", "-aHS", "--checksum", "--dry-run", "--itemize-changes", "--out-format=%i %n"]
    argv += [*_EXCLUDES, src.rstrip("/") + "/", dest.rstrip("/") + "/"]
    res = runner.run(argv, timeout=timeout)
    if res.returncode != 0:
        return [f"(rsync verify exited {res.returncode}: {_tail(res)})"]
    diffs = []
    for line in res.stdout.splitlines():
        code, _, name = line.partition(" ")
        # transfers start with '<' or '>' ('c' = created); '.' lines only change attributes
        if code[:1] in "<>c" and code and not name.endswith("/"):
            diffs.append(name)
    return diffs
