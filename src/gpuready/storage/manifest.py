"""Manifests: one `<hex>  <path>` line per file, the format `b3sum -c` and `sha256sum -c` accept, plus a
sidecar `FILE.json` with the file count and total bytes (BagIt's Payload-Oxum idea), because `-c` alone cannot
notice extra files.

Names are escaped the way both tools read them: a name holding `\\` or a newline has them written as `\\\\`
and `\\n` and its line starts with `\\` (BLAKE3-team/BLAKE3 `b3sum/what_does_check_do.md`, coreutils
sha256sum(1)). A carriage return is written as it is: GNU sha256sum 9.1 writes `\\r`, but
Debian's b3sum 1.2.0 (bookworm) rejects `\\r` as "Invalid backslash escape" and reads a raw one, while
sha256sum drops a raw one at the end of a line. So BLAKE3 manifests (for b3sum) keep it raw and SHA-256
manifests (for sha256sum) escape it (checked with b3sum 1.2.0 and sha256sum 9.1). Reading accepts both.
Lines are split on `\\n` only (never str.splitlines(), which also splits on \\x0b \\x0c \\x1c \\x85 \\u2028...).
Names that are not UTF-8 are written as their raw bytes (what sha256sum does) and read back to the same bytes
(Python's surrogateescape); b3sum 1.2.0 cannot check such names at all ("Unicode replacement character").

A manifest is checked where it lies: paths resolve against the manifest's folder (or an explicit DIR), as
`b3sum -c` resolves them against the current folder. The sidecar's recorded root is shown, never used.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuready.errors import InputError
from gpuready.storage.hashing import ALGORITHMS, Algorithm, FileChangedError, hash_file
from gpuready.storage.walk import FileEntry, WalkStats, walk_files

FORMAT = "gpuready-manifest/1"
ByteProgress = Callable[[int, int], None]  # (bytes done, bytes total)


def escape_name(name: str, escape_cr: bool = False) -> tuple[str, bool]:
    """The name as written in a manifest, and whether the line needs the leading backslash. `escape_cr` for
    sha256 manifests: GNU sha256sum drops a raw carriage return at the end of a line (DOS line endings), so a
    name ending in one is only read back from `\\r`, the escape sha256sum itself writes."""
    cr = escape_cr and "\r" in name
    if "\\" not in name and "\n" not in name and not cr:
        return name, False
    out = name.replace("\\", "\\\\").replace("\n", "\\n")
    return (out.replace("\r", "\\r") if cr else out), True


def unescape_name(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append({"\\": "\\", "n": "\n", "r": "\r"}.get(nxt, "\\" + nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def format_line(hexdigest: str, name: str, escape_cr: bool = False) -> str:
    escaped, flagged = escape_name(name, escape_cr)
    prefix = "\\" if flagged else ""
    return f"{prefix}{hexdigest}  {escaped}\n"


def parse_line(line: str) -> tuple[str, str] | None:
    """(hexdigest, name) from a `b3sum`/`sha256sum` line (text or `*` binary mode); None if malformed.
    Only the line's own `\\n` terminator is dropped: any other character, `\\r` included, belongs to the name."""
    if line.endswith("\n"):
        line = line[:-1]
    flagged = line.startswith("\\")
    if flagged:
        line = line[1:]
    digest, sep, rest = line.partition(" ")
    if not sep or not rest or rest[0] not in " *" or not all(c in "0123456789abcdefABCDEF" for c in digest):
        return None
    name = rest[1:]
    return digest.lower(), unescape_name(name) if flagged else name


def meta_path(manifest: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(manifest) + ".json")


def algorithm_for(path: str | os.PathLike[str], given: str | None = None) -> Algorithm:
    """--algo if given, else the sidecar's, else by extension (.sha256 -> sha256), else BLAKE3."""
    if given is not None:
        if given not in ALGORITHMS:
            raise InputError("--algo", f"{given!r}; allowed: {', '.join(ALGORITHMS)}")
        return given
    meta = _read_meta(Path(path))
    if meta and meta.get("algorithm") in ALGORITHMS:
        return meta["algorithm"]  # type: ignore[no-any-return]
    return algorithm_from_name(path)


def algorithm_from_name(path: str | os.PathLike[str]) -> Algorithm:
    return "sha256" if os.fspath(path).lower().endswith((".sha256", ".sha256sum", ".sha256sums")) else "blake3"


def _read_meta(manifest: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(meta_path(manifest).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class ManifestResult:
    manifest: str
    meta: str
    root: str
    algorithm: str
    files: int
    total_bytes: int
    bytes_read: int
    seconds: float
    changed_files: list[str]  # modified while read: left out of the manifest, reported
    unreadable_files: list[str]
    unreadable_dirs: list[str]
    symlinks_skipped: int  # links leaving the tree (or to folders) are not followed

    @property
    def complete(self) -> bool:
        return not (self.changed_files or self.unreadable_files or self.unreadable_dirs)

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "meta": self.meta,
            "root": self.root,
            "algorithm": self.algorithm,
            "files": self.files,
            "total_bytes": self.total_bytes,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 3),
            "complete": self.complete,
            "changed_files": self.changed_files,
            "unreadable_files": self.unreadable_files,
            "unreadable_dirs": self.unreadable_dirs,
            "symlinks_skipped": self.symlinks_skipped,
        }


@dataclass
class _HashRun:
    digests: dict[str, str] = field(default_factory=dict)  # rel -> hex
    changed: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    bytes_read: int = 0


def _hash_entries(
    entries: list[FileEntry], algorithm: Algorithm, progress: ByteProgress | None, workers: int | None
) -> _HashRun:
    """Hash files in parallel; hard links and in-tree symlinks to one inode are read once."""
    run = _HashRun()
    total = sum(e.size for e in entries)
    by_inode: dict[tuple[int, int], list[FileEntry]] = {}
    for e in entries:
        by_inode.setdefault((e.dev, e.ino), []).append(e)

    def one(group: list[FileEntry]) -> tuple[list[FileEntry], str | None, int, str]:
        try:
            d = hash_file(group[0].path, algorithm)
        except FileChangedError:
            return group, None, 0, "changed"
        except OSError:
            return group, None, 0, "unreadable"
        return group, d.hexdigest, d.bytes_read, ""

    done = 0
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for group, digest, read, why in pool.map(one, by_inode.values()):
            run.bytes_read += read
            done += group[0].size * len(group)
            if progress is not None:
                progress(done, total)
            for e in group:
                if digest is not None:
                    run.digests[e.rel] = digest
                elif why == "changed":
                    run.changed.append(e.rel)
                else:
                    run.unreadable.append(e.rel)
    return run


def _write_atomic(path: Path, data: bytes) -> None:
    """Write under a temporary name in the same folder, then rename over; the temporary file never stays."""
    tmp = Path(os.fspath(path) + ".tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise InputError("-o", f"cannot write {os.fspath(path)!r}: {exc.strerror or exc}") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _own_files(root: str, manifest: Path) -> frozenset[str]:
    m = os.path.abspath(manifest)
    return frozenset({m, m + ".json", m + ".tmp", m + ".json.tmp"})


def create_manifest(
    root: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    algorithm: str | None = None,
    progress: ByteProgress | None = None,
    workers: int | None = None,
    record_root: str | os.PathLike[str] | None = None,
    exclude_rel: frozenset[str] = frozenset(),
) -> ManifestResult:
    """Hash every file under `root` into `output` (+ `output.json`), paths relative to `root`, sorted.
    `record_root` is the root written in the sidecar (default `root`): `sync` records the destination."""
    start = time.monotonic()
    root_path = Path(root)
    if not root_path.is_dir():
        raise InputError("DIR", f"{os.fspath(root)!r} is not a folder")
    out = Path(output)
    if out.is_dir():
        raise InputError("-o", f"{os.fspath(output)!r} is a folder; give a file name such as manifest.b3")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise InputError("--algo", f"{algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
    algo: Algorithm = algorithm if algorithm is not None else algorithm_from_name(out)
    stats = WalkStats()
    own = _own_files(str(root_path), out) | {os.path.join(os.path.abspath(root_path), r) for r in exclude_rel}
    entries = list(walk_files([root_path], stats, follow_symlinks_in_tree=True, exclude=own))
    run = _hash_entries(entries, algo, progress, workers)
    sizes = {e.rel: e.size for e in entries if e.rel in run.digests}
    meta = {
        "format": FORMAT,
        "algorithm": algo,
        "root": str(Path(record_root or root_path).resolve()),  # information only: verify never uses it
        "files": len(sizes),
        "total_bytes": sum(sizes.values()),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sizes": dict(sorted(sizes.items())),
    }
    cr = algo == "sha256"  # sha256sum needs `\\r`, b3sum 1.2.0 refuses it (module docstring)
    lines = b"".join(
        format_line(run.digests[rel], rel, cr).encode("utf-8", "surrogateescape") for rel in sorted(run.digests)
    )
    # ensure_ascii: a name that is not UTF-8 is kept as a \udcXX escape, read back to the same bytes
    _write_atomic(out, lines)
    _write_atomic(meta_path(out), (json.dumps(meta, indent=1, ensure_ascii=True) + "\n").encode("ascii"))
    return ManifestResult(
        manifest=str(out),
        meta=str(meta_path(out)),
        root=str(root_path.resolve()),
        algorithm=algo,
        files=len(sizes),
        total_bytes=sum(sizes.values()),
        bytes_read=run.bytes_read,
        seconds=time.monotonic() - start,
        changed_files=sorted(run.changed),
        unreadable_files=sorted(run.unreadable),
        unreadable_dirs=stats.unreadable_dirs,
        symlinks_skipped=stats.symlinks_skipped,
    )


@dataclass(frozen=True)
class VerifyResult:
    manifest: str
    root: str  # where the files were read: DIR, else the manifest's folder
    recorded_root: str | None  # where `manifest create` ran (from the sidecar): information only
    algorithm: str
    expected_files: int
    expected_bytes: int | None  # from the sidecar; None when there is none
    checked: int
    changed: list[str]
    missing: list[str]
    extra: list[str]  # files under the root the manifest does not name
    unreadable: list[str]
    changed_during_read: list[str]
    malformed_lines: int
    incomplete_manifest: bool  # line count differs from the sidecar's file count
    bytes_read: int
    seconds: float
    extra_fails: bool = True  # False for `sync` without --delete: files DEST had before are reported only

    @property
    def ok(self) -> bool:
        return not (
            self.changed
            or self.missing
            or (self.extra and self.extra_fails)
            or self.unreadable
            or self.changed_during_read
            or self.malformed_lines
            or self.incomplete_manifest
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "manifest": self.manifest,
            "root": self.root,
            "recorded_root": self.recorded_root,
            "algorithm": self.algorithm,
            "expected_files": self.expected_files,
            "expected_bytes": self.expected_bytes,
            "checked": self.checked,
            "changed": self.changed,
            "missing": self.missing,
            "extra": self.extra,
            "extra_fails": self.extra_fails,
            "unreadable": self.unreadable,
            "changed_during_read": self.changed_during_read,
            "malformed_lines": self.malformed_lines,
            "incomplete_manifest": self.incomplete_manifest,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 3),
        }


def read_manifest(path: str | os.PathLike[str]) -> tuple[dict[str, str], int]:
    """(name -> hexdigest, number of malformed lines). Lines end at `\\n` only; bytes that are not UTF-8
    come back as surrogate escapes, the way os.scandir names such files."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError("FILE", f"{os.fspath(path)!r}: no such manifest") from None
    except OSError as exc:
        raise InputError("FILE", f"{os.fspath(path)!r}: {exc.strerror or exc}") from None
    entries: dict[str, str] = {}
    bad = 0
    for raw_line in raw.split(b"\n"):
        if not raw_line:
            continue
        parsed = parse_line(raw_line.decode("utf-8", "surrogateescape"))
        if parsed is None:
            bad += 1
            continue
        entries[parsed[1]] = parsed[0]
    return entries, bad


def default_root(manifest: str | os.PathLike[str]) -> Path:
    """The manifest's own folder: a copied tree is checked where it is, never where it was made."""
    return Path(os.path.abspath(manifest)).parent


def verify_manifest(
    manifest: str | os.PathLike[str],
    root: str | os.PathLike[str] | None = None,
    *,
    algorithm: str | None = None,
    progress: ByteProgress | None = None,
    workers: int | None = None,
    extra_fails: bool = True,
) -> VerifyResult:
    """Re-read every file under `root` and compare with the manifest: changed, missing and extra files.
    `root` defaults to the manifest's folder; with `extra_fails=False` extra files are listed, not failed."""
    start = time.monotonic()
    expected, bad = read_manifest(manifest)
    algo = algorithm_for(manifest, algorithm)
    meta = _read_meta(Path(manifest)) or {}
    root_path = Path(root) if root is not None else default_root(manifest)
    if not root_path.is_dir():
        raise InputError("DIR", f"{os.fspath(root_path)!r} is not a folder")
    stats = WalkStats()
    own = _own_files(str(root_path), Path(manifest))
    present = {e.rel: e for e in walk_files([root_path], stats, follow_symlinks_in_tree=True, exclude=own)}
    missing = sorted(set(expected) - set(present))
    extra = sorted(set(present) - set(expected))
    raw_sizes = meta.get("sizes")
    sizes: dict[str, Any] = raw_sizes if isinstance(raw_sizes, dict) else {}
    # a size that differs from the sidecar's is a change found without reading the file
    changed = sorted(rel for rel in expected if rel in present and rel in sizes and sizes[rel] != present[rel].size)
    to_hash = [present[rel] for rel in sorted(expected) if rel in present and rel not in set(changed)]
    run = _hash_entries(to_hash, algo, progress, workers)
    by_size = len(changed)
    changed = sorted(set(changed) | {rel for rel, d in run.digests.items() if d != expected[rel]})
    meta_files = meta.get("files")
    recorded = meta.get("root")
    return VerifyResult(
        manifest=str(manifest),
        root=str(root_path),
        recorded_root=recorded if isinstance(recorded, str) else None,
        algorithm=algo,
        expected_files=len(expected),
        expected_bytes=meta.get("total_bytes") if isinstance(meta.get("total_bytes"), int) else None,
        checked=len(run.digests) + by_size,
        changed=changed,
        missing=missing,
        extra=extra,
        unreadable=sorted(run.unreadable) + stats.unreadable_dirs,
        changed_during_read=sorted(run.changed),
        malformed_lines=bad,
        incomplete_manifest=isinstance(meta_files, int) and meta_files != len(expected),
        bytes_read=run.bytes_read,
        seconds=time.monotonic() - start,
        extra_fails=extra_fails,
    )
