"""A short, bounded disk speed test on the folder the data will live in: sequential write and read in 1 MiB
blocks and 4 KiB random reads, with O_DIRECT where the filesystem allows it (so the page cache is not what is
measured), on one new file that is removed afterwards.

Bounded: at most `size_bytes` (never more than a quarter of the free space) and about `max_seconds` per phase.
Safe: the file is created with O_EXCL under a new name, so nothing existing is ever opened for writing, and it
is removed only if it is still the file created (same device and inode). An unwritable folder is a result
(`error`), never a crash.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from gpuready.bench.record import Disk
from gpuready.units import GIB, MIB

BLOCK = MIB
SMALL = 4096
DEFAULT_SIZE_BYTES = GIB
DEFAULT_MAX_SECONDS = 8.0
RANDOM_SECONDS = 2.0


def _open(path: Path, flags: int, direct: bool) -> int:
    o_direct = getattr(os, "O_DIRECT", 0)
    return os.open(path, flags | (o_direct if direct else 0), 0o600)


def disk_speed(
    folder: Path,
    *,
    size_bytes: int = DEFAULT_SIZE_BYTES,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    random_seconds: float = RANDOM_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> Disk:
    """Measure `folder`'s disk. Returns a Disk record (with `error` set when the test could not run)."""
    now = clock
    folder = folder.expanduser()
    result = Disk(path=str(folder))
    if not folder.is_dir():
        return result.model_copy(update={"error": f"{folder}: not a folder"})
    try:
        free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    except OSError as exc:
        return result.model_copy(update={"error": f"{folder}: {exc.strerror}"})
    size = min(size_bytes, free // 4) // BLOCK * BLOCK
    if size < BLOCK:
        return result.model_copy(update={"error": f"{folder}: too little free space for a disk test"})
    target = folder / f".gpuready-disk-test-{uuid.uuid4().hex}"
    # an aligned buffer (mmap is page-aligned), as O_DIRECT requires
    buf = mmap.mmap(-1, BLOCK)
    buf.write(os.urandom(BLOCK))
    direct = hasattr(os, "O_DIRECT")
    created: os.stat_result | None = None
    t_start = now()
    try:
        try:
            fd = _open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, direct)
        except OSError:
            # tmpfs and some network filesystems refuse O_DIRECT (EINVAL): measure through the cache, say so
            direct = False
            fd = _open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, False)
        created = os.fstat(fd)
        written = 0
        try:
            t0 = now()
            while written < size and now() - t0 < max_seconds:
                written += os.write(fd, buf)
            os.fsync(fd)
            write_s = now() - t0
        finally:
            os.close(fd)
        fd = _open(target, os.O_RDONLY, direct)
        try:
            if not direct:
                with contextlib.suppress(AttributeError, OSError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            read = 0
            t0 = now()
            while read < written and now() - t0 < max_seconds:
                n = os.readv(fd, [buf])
                if n <= 0:
                    break
                read += n
            read_s = now() - t0
            ios = 0
            blocks = max(1, written // SMALL)
            small = mmap.mmap(-1, SMALL)
            rng = random.Random(0)
            t0 = now()
            while now() - t0 < random_seconds:
                os.lseek(fd, rng.randrange(blocks) * SMALL, os.SEEK_SET)
                os.readv(fd, [small])
                ios += 1
            random_s = now() - t0
        finally:
            os.close(fd)
        return result.model_copy(
            update={
                "bytes": written,
                "write_bytes_per_second": written / write_s if write_s > 0 else None,
                "read_bytes_per_second": read / read_s if read_s > 0 else None,
                "random_read_iops": ios / random_s if random_s > 0 else None,
                "direct": direct,
                "seconds": now() - t_start,
            }
        )
    except OSError as exc:
        return result.model_copy(update={"error": f"{folder}: {exc.strerror or exc}", "direct": direct})
    finally:
        buf.close()
        if created is not None:
            with contextlib.suppress(OSError):
                st = os.lstat(target)
                if (st.st_dev, st.st_ino) == (created.st_dev, created.st_ino):
                    target.unlink()
