"""Hashing files: BLAKE3 by default (one thread per file), SHA-256 where digests must match the Hugging Face
Hub's (LFS blobs are named by their sha256: huggingface_hub `file_download.py`, `utils/_verification.py`).

A file that changes while it is read (size, mtime or inode differ before and after) raises `FileChangedError`
instead of returning a digest of bytes that never existed together on disk.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from gpuready.errors import InputError

Algorithm = Literal["blake3", "sha256"]
ALGORITHMS: tuple[Algorithm, ...] = ("blake3", "sha256")
CHUNK = 1 << 20  # 1 MiB reads into one reused buffer
BLOCK = 4096  # head/tail block: disks and filesystems work in 4 KiB units (jdupes' author, windirstat#275)


class _Hasher(Protocol):
    def update(self, data: memoryview | bytes, /) -> object: ...
    def hexdigest(self) -> str: ...


class FileChangedError(OSError):
    """The file was modified while it was being hashed."""


def new_hasher(algorithm: str) -> _Hasher:
    if algorithm == "blake3":
        from blake3 import blake3

        # single-threaded per file: multithreaded BLAKE3 can be ~100x slower on spinning disks (InvokeAI#6020)
        return blake3(max_threads=1)
    if algorithm == "sha256":
        return hashlib.sha256()
    raise InputError("--algo", f"{algorithm!r} is not supported; allowed: {', '.join(ALGORITHMS)}")


@dataclass(frozen=True)
class Digest:
    hexdigest: str
    bytes_read: int


def _signature(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def hash_file(
    path: str,
    algorithm: str = "blake3",
    on_bytes: Callable[[int], None] | None = None,
    *,
    expect: tuple[int, int, int] | None = None,
) -> Digest:
    """Hash a whole file; raises FileChangedError if it changed during the read (or, with `expect` =
    (size, mtime_ns, inode), if it is no longer the file a scan listed), OSError if unreadable."""
    hasher = new_hasher(algorithm)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as fh:
        before = _signature(os.fstat(fh.fileno()))
        if expect is not None and before != expect:
            raise FileChangedError(f"{path} changed since it was listed")
        # read what was there when opened, never more: a file that keeps growing cannot hold the read forever
        while total < before[0]:
            n = fh.readinto(buf if before[0] - total >= CHUNK else view[: before[0] - total])
            if not n:
                break
            hasher.update(view[:n])
            total += n
            if on_bytes is not None:
                on_bytes(n)
        after = _signature(os.fstat(fh.fileno()))
    if before != after or total != before[0]:
        raise FileChangedError(f"{path} changed while it was read")
    return Digest(hasher.hexdigest(), total)


def _read_full(fh: object, size: int, offset: int) -> bytes:
    # os.pread may return fewer bytes than asked; loop until the block is full (czkawka's `read_filling`)
    fd = fh.fileno()  # type: ignore[attr-defined]
    parts: list[bytes] = []
    got = 0
    while got < size:
        part = os.pread(fd, size - got, offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def head_tail_digest(path: str, size: int, block: int = BLOCK, *, expect: tuple[int, int, int] | None = None) -> Digest:
    """BLAKE3 of the first and last `block` bytes (the whole file when it is at most 2 blocks long)."""
    hasher = new_hasher("blake3")
    with open(path, "rb", buffering=0) as fh:
        before = _signature(os.fstat(fh.fileno()))
        if before[0] != size or (expect is not None and before != expect):
            raise FileChangedError(f"{path} changed since it was listed")
        if size <= 2 * block:
            data = _read_full(fh, size, 0)
            read = len(data)
            hasher.update(data)
        else:
            head = _read_full(fh, block, 0)
            tail = _read_full(fh, block, size - block)
            read = len(head) + len(tail)
            hasher.update(head)
            hasher.update(tail)
        after = _signature(os.fstat(fh.fileno()))
    if before != after:
        raise FileChangedError(f"{path} changed while it was read")
    return Digest(hasher.hexdigest(), read)
