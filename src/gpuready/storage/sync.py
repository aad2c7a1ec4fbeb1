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
        }


def rsync_argv(src: str, dest: str, *, checksum: bool = False, dry_run: bool = False) -> list[str]:
    argv = ["rsync", "-a", "--partial", "--info=progress2", "--no-inc-recursive"]
    if checksum:
        argv.append("--checksum")
    if dry_run:
        argv.append("--dry-run")
    argv += [f"--exclude=/{MANIFEST_NAME}", f"--exclude=/{MANIFEST_NAME}.json"]
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


def sync(
    src: str,
    dest: str,
    *,
    runner: Runner,
    timeout: float = 24 * 3600,
    checksum: bool = False,
    dry_run: bool = False,
    copy_progress: ByteProgress | None = None,
    verify_progress: ByteProgress | None = None,
) -> SyncResult:
    """Copy SRC (a folder) to DEST and verify DEST. Faults (tool missing, copy interrupted, verify failed)
    come back in the result; only bad input raises."""
    if not os.path.isdir(src):
        raise InputError("SRC", f"{src!r} is not a folder")
    if timeout <= 0:
        raise InputError("--timeout", "must be a positive number of seconds")
    stats = WalkStats()
    for _ in walk_files([src], stats, follow_symlinks_in_tree=True):
        pass
    kind = target_kind(dest, runner)
    tool = "rclone" if kind == "rclone" else "rsync"
    if runner.which(tool) is None:
        raise GpureadyError(f"{tool} is not installed; install it (apt-get install {tool}) and run again")
    if kind == "rclone":
        argv = ["rclone", "copy", src, dest]
        if dry_run:
            argv.append("--dry-run")
        res = runner.run(argv, timeout=timeout)
    else:
        if kind == "local" and not dry_run:
            os.makedirs(dest, exist_ok=True)
        argv = rsync_argv(src, dest, checksum=checksum, dry_run=dry_run)
        res = runner.run(argv, timeout=timeout, on_line=_progress_parser(stats.bytes, copy_progress))
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
    )
    if res.returncode != 0 or res.timed_out:
        why = "timed out" if res.timed_out else f"{tool} exited {res.returncode}: {_tail(res)}"
        return replace(base, message=f"copy incomplete ({why}); run the same command again to resume")
    if dry_run:
        return replace(base, message="dry run: nothing copied")
    if kind == "local":
        manifest = os.path.join(dest, MANIFEST_NAME)
        made = create_manifest(src, manifest, record_root=dest, progress=verify_progress)
        check = verify_manifest(manifest, dest, progress=verify_progress)
        problems = made.changed_files + made.unreadable_files
        ok = check.ok and not problems
        if ok:
            msg = f"copied and verified {check.checked} files"
        elif problems:
            msg = f"source files changed or unreadable while hashed: {', '.join(problems[:5])}"
        else:
            msg = "verification failed; run again with --checksum to re-copy files whose size and time match"
        return replace(base, copied=True, verified=ok, message=msg, verify=check, manifest=manifest)
    diffs = _remote_differences(kind, src, dest, runner, timeout)
    msg = "copied and verified" if not diffs else f"{len(diffs)} path(s) differ after the copy"
    return replace(base, copied=True, verified=not diffs, message=msg, differences=diffs)


def _remote_differences(kind: Target, src: str, dest: str, runner: Runner, timeout: float) -> list[str]:
    """Paths that differ between SRC and a remote DEST, both sides read in full by the tool."""
    if kind == "rclone":
        res = runner.run(["rclone", "check", src, dest, "--one-way", "--combined", "-"], timeout=timeout)
        diffs = [line[2:] for line in res.stdout.splitlines() if line[:2] in ("+ ", "* ", "! ", "- ")]
        if res.returncode != 0 and not diffs:
            diffs = [f"(rclone check exited {res.returncode}: {_tail(res)})"]
        return diffs
    argv = ["rsync", "-a", "--checksum", "--dry-run", "--itemize-changes", "--out-format=%i %n"]
    argv += [f"--exclude=/{MANIFEST_NAME}", src.rstrip("/") + "/", dest.rstrip("/") + "/"]
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
