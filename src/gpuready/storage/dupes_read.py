"""Reading for storage/dupes.py: the scan (os.scandir over bytes paths, one lstat per entry, one packed record per
regular file) and the reading of candidates: files up to `SMALL` bytes whole in one read each, one size group at a
time, in the scanning thread or in forked readers for many of them; larger ones by a head+tail filter, then hashed in
full (BLAKE3) in a thread pool. Every outcome is the content's digest or why there is none (changed while read,
unreadable): content is the only proof of equality (see storage/dupes.py)."""

from __future__ import annotations

import contextlib
import functools
import marshal
import os
import signal
import stat
import struct
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuready.storage.hashing import FileChangedError, hash_file, head_tail_digest

if TYPE_CHECKING:
    from gpuready.storage.dupes import _Grouper

Progress = Callable[[str, int, int], None]  # (stage, done, total)

SMALL = 64 * 1024  # up to this size a file is read whole in one call and hashed inline (batches)
_PROGRESS = 2048  # small files between two progress reports
_FORK_MIN = 8192  # small candidates below which one process reads them all (a fork costs milliseconds)
_MAX_PROCS = 4  # processes reading small files at most
_FRAME = struct.Struct("=Q")  # a forked reader's frame: its length, then marshal data
_HOLD = 32 << 20  # a size group of small files with more content than this is keyed by digests, not held
_KEY = 64  # small files of one size are told apart by their first bytes, then by every byte
_REC = struct.Struct("=QqI")  # ino, mtime_ns, folder index; the name's bytes follow (device: per folder)


def _rec_path(dirs: list[bytes], rec: bytes) -> bytes:
    idx: int = _REC.unpack_from(rec)[2]
    return dirs[idx] + b"/" + rec[_REC.size :]


# ---------------------------------------------------------------------------------------------------------
# Scan: os.scandir over bytes paths, one lstat per entry, one packed record per regular file.


@dataclass
class _Scan:
    dirs: list[bytes] = field(default_factory=list)
    devs: list[int] = field(default_factory=list)  # per entry of `dirs`
    by_size: dict[int, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    files: int = 0
    total_bytes: int = 0
    unreadable_dirs: list[str] = field(default_factory=list)
    symlinks: list[str] = field(default_factory=list)

    def path(self, rec: bytes) -> bytes:
        return _rec_path(self.dirs, rec)


def _distinct_roots(roots: Sequence[str | os.PathLike[str]]) -> list[bytes]:
    """Absolute roots as bytes; a root inside another one (after resolving symlinks) is scanned once."""
    out: list[tuple[bytes, bytes]] = []
    for r in roots:
        absolute = os.fsencode(os.path.abspath(os.fspath(r)))
        real = os.path.realpath(absolute)
        out.append((real, absolute))
    out.sort(key=lambda x: len(x[0]))
    kept: list[tuple[bytes, bytes]] = []
    for real, absolute in out:
        if any(real == k or real.startswith(k.rstrip(b"/") + b"/") for k, _ in kept):
            continue
        kept.append((real, absolute))
    return [a for _, a in kept]


def _scan(roots: list[bytes], min_size: int, progress: Progress | None) -> _Scan:
    sc = _Scan()
    pack = _REC.pack
    by_size = sc.by_size
    S_ISREG = stat.S_ISREG  # a local: looked up once, not per file
    for root in roots:
        try:
            st = os.lstat(root)
        except OSError:
            sc.unreadable_dirs.append(os.fsdecode(root))
            continue
        if stat.S_ISLNK(st.st_mode):
            # a root given as a link to a folder (/data -> /mnt/nvme/data) is scanned; a link to a file is not
            # a file to act on (acting would replace the link), so it only protects its target
            try:
                is_dir = stat.S_ISDIR(os.stat(root).st_mode)
            except OSError:
                is_dir = False
            if not is_dir:
                sc.symlinks.append(os.fsdecode(root))
                continue
        elif stat.S_ISREG(st.st_mode):
            sc.files += 1
            sc.total_bytes += st.st_size
            if st.st_size >= min_size:
                d, name = os.path.split(root)
                sc.dirs.append(d)
                sc.devs.append(st.st_dev)
                by_size[st.st_size].append(pack(st.st_ino, st.st_mtime_ns, len(sc.dirs) - 1) + name)
            continue
        stack = [root]
        files = total = 0  # counted in locals: an attribute update per file is a measurable share
        while stack:
            folder = stack.pop()
            try:
                it = os.scandir(folder)
            except OSError:
                sc.unreadable_dirs.append(os.fsdecode(folder))
                continue
            idx = len(sc.dirs)
            sc.dirs.append(folder)
            dev = -1
            sc.devs.append(dev)
            with it:
                for entry in it:
                    # the entry's type comes from the listing itself (d_type): no system call for folders and
                    # symlinks; one lstat for everything else (a file's size, inode and mtime_ns)
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                            continue
                        if entry.is_symlink():
                            sc.symlinks.append(os.fsdecode(entry.path))
                            continue
                        est = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # vanished between listing and stat
                    if not S_ISREG(est.st_mode):
                        continue  # fifos, sockets, devices are never opened
                    size = est.st_size
                    files += 1
                    total += size
                    if size >= min_size:
                        if est.st_dev != dev:
                            if dev == -1:  # the folder's device is that of its first file
                                dev = sc.devs[idx] = est.st_dev
                            else:  # a file bind-mounted from elsewhere: a folder entry of its own
                                sc.dirs.append(folder)
                                sc.devs.append(est.st_dev)
                                by_size[size].append(pack(est.st_ino, est.st_mtime_ns, len(sc.dirs) - 1) + entry.name)
                                continue
                        by_size[size].append(pack(est.st_ino, est.st_mtime_ns, idx) + entry.name)
            if progress is not None:
                progress("listing", sc.files + files, 0)
        sc.files += files
        sc.total_bytes += total
    return sc


# ---------------------------------------------------------------------------------------------------------
# Hashing candidates. A worker returns (digest, bytes read), "changed" or "unreadable" per file.

# A file's outcome: its digest (bytes), or why it has none. Bytes read are counted by the caller.
_CHANGED = "changed"
_UNREADABLE = "unreadable"
_Outcome = bytes | str
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


@functools.cache
def _blake3() -> Any:
    from blake3 import blake3

    return blake3


_SmallGroups = list[tuple[bytes, list[bytes]]]


def _small_groups(
    dirs: list[bytes], size: int, recs: list[bytes], changed: list[bytes], unreadable: list[bytes]
) -> _SmallGroups:
    """The duplicates among the small files of one size: (BLAKE3 digest, records) per content two or more hold.

    Every file is read whole in one call. Files are keyed by their first `_KEY` bytes, and those that share
    them by their whole content, so equality is decided by comparing every byte (as jdupes does), not by a
    digest, and only duplicates are hashed (a digest names the group in the report). A size group with more
    than `_HOLD` bytes of content is not held in memory: its files are keyed by their BLAKE3-256 digests, the
    proof large files get.

    A file goes to `changed` unless, after the read, it is still the one the scan listed (size, mtime_ns,
    inode): one fstat per file is the cheapest proof that the bytes compared are the bytes listed. Files that
    cannot be opened or read go to `unreadable`. The loop is inlined on purpose: at ~15 µs a file, most of it
    four system calls, each Python step per file is a measurable share (docs/storage_benchmark.md).
    """
    b3 = _blake3()
    unpack = _REC.unpack_from
    skip = _REC.size
    open_, read, fstat, close, flags = os.open, os.read, os.fstat, os.close, _OPEN_FLAGS
    by_digest = len(recs) * size > _HOLD
    heads: dict[bytes, tuple[bytes, bytes]] = {}  # first _KEY bytes -> (record, content) of the first file
    seen: dict[bytes, dict[bytes, list[bytes]]] = {}  # first _KEY bytes shared -> content -> records
    digests: dict[bytes, list[bytes]] = {}  # by_digest: BLAKE3 digest -> records
    for rec in recs:
        ino, mtime_ns, idx = unpack(rec)
        path = dirs[idx] + b"/" + rec[skip:]
        try:
            fd = open_(path, flags)
        except OSError:
            unreadable.append(rec)
            continue
        try:
            data = read(fd, size + 1)
            st = fstat(fd)
        except OSError:
            unreadable.append(rec)
            continue
        finally:
            close(fd)
        if st.st_mtime_ns != mtime_ns or st.st_ino != ino or st.st_size != size or len(data) != size:
            got = _read_again(path, size, (size, mtime_ns, ino), st, data)
            if isinstance(got, str):
                (changed if got == _CHANGED else unreadable).append(rec)
                continue
            data = got
        if by_digest:
            digests.setdefault(b3(data, max_threads=1).digest(), []).append(rec)
            continue
        # Files of one size mostly differ in their first bytes: a dict keyed by those is cheap (hashing the
        # whole content costs ~2.5 us a 4 KiB file); only files that share them are keyed by every byte.
        first = (rec, data)
        other = heads.setdefault(data[:_KEY], first)
        if other is first:
            continue
        same = seen.get(data[:_KEY])
        if same is None:
            same = seen[data[:_KEY]] = {other[1]: [other[0]]}
        members = same.get(data)
        if members is None:
            same[data] = [rec]
        else:
            members.append(rec)
    if by_digest:
        return [(digest, members) for digest, members in digests.items() if len(members) > 1]
    return [
        (b3(content, max_threads=1).digest(), members)
        for same in seen.values()
        for content, members in same.items()
        if len(members) > 1
    ]


def _read_again(path: bytes, size: int, listed: tuple[int, int, int], st: os.stat_result, data: bytes) -> bytes | str:
    """The slow path of `_small_groups`: a file that changed (`_CHANGED`), or a short read (some network
    filesystems return less than asked) read again in a loop and re-checked, or `_UNREADABLE`."""
    if (st.st_size, st.st_mtime_ns, st.st_ino) != listed or len(data) > size:
        return _CHANGED
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return _UNREADABLE
    try:
        parts = []
        got = 0
        while got <= size:
            part = os.read(fd, size + 1 - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        st = os.fstat(fd)
    except OSError:
        return _UNREADABLE
    finally:
        os.close(fd)
    if got != size or (st.st_size, st.st_mtime_ns, st.st_ino) != listed:
        return _CHANGED
    return b"".join(parts)


def _partial(path: bytes, size: int, ino: int, mtime_ns: int) -> _Outcome:
    try:
        d = head_tail_digest(os.fsdecode(path), size, expect=(size, mtime_ns, ino))
    except FileChangedError:
        return _CHANGED
    except OSError:
        return _UNREADABLE
    return bytes.fromhex(d.hexdigest)


def _full(path: bytes, size: int, ino: int, mtime_ns: int) -> _Outcome:
    try:
        d = hash_file(os.fsdecode(path), "blake3", expect=(size, mtime_ns, ino))
    except FileChangedError:
        return _CHANGED
    except OSError:
        return _UNREADABLE
    return bytes.fromhex(d.hexdigest)


def _bounded(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], jobs: Iterator[Any], depth: int) -> Iterator[Any]:
    """(job, fn(job)) in order, at most `depth` jobs in flight (Executor.map submits the whole iterable)."""
    pending: deque[tuple[Any, Future[Any]]] = deque()
    for job in jobs:
        pending.append((job, pool.submit(fn, job)))
        if len(pending) >= depth:
            j, fut = pending.popleft()
            yield j, fut.result()
    while pending:
        j, fut = pending.popleft()
        yield j, fut.result()


def _cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_Share = list[tuple[int, list[bytes]] | None]  # size groups; None once settled
_Found = tuple[int, int, list[tuple[bytes, list[int]]], list[int], list[int]]  # a child's outcome, by position


def _send(fd: int, found: list[_Found]) -> None:
    """One frame to the parent: length, then the marshalled outcomes (records as positions in the share)."""
    data = marshal.dumps(found)
    view = memoryview(_FRAME.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _child(dirs: list[bytes], share: list[tuple[int, list[bytes]]], fd: int) -> None:
    """A forked reader: `_small_groups` over its share, sent back a frame every `_PROGRESS` files. Every record
    goes back as its position in the share, which the parent holds too: a few bytes a duplicate, not its name."""
    found: list[_Found] = []
    files = 0
    for i, (size, recs) in enumerate(share):
        changed: list[bytes] = []
        unreadable: list[bytes] = []
        groups = _small_groups(dirs, size, recs, changed, unreadable)
        if groups or changed or unreadable:
            pos = {rec: j for j, rec in enumerate(recs)}
            found.append(
                (
                    i,
                    len(recs),
                    [(digest, [pos[r] for r in members]) for digest, members in groups],
                    [pos[r] for r in changed],
                    [pos[r] for r in unreadable],
                )
            )
        else:
            found.append((i, len(recs), [], [], []))
        files += len(recs)
        if files >= _PROGRESS:
            _send(fd, found)
            found, files = [], 0
    _send(fd, found)


@dataclass
class _Reader:
    """The parent's side of one forked reader: its pipe, and its share until each size group is settled."""

    pid: int
    fd: int
    share: _Share
    buf: bytearray = field(default_factory=bytearray)
    settled: int = 0  # files
    eof: bool = False
    failed: bool = False

    def drain(self, g: _Grouper, block: bool) -> None:
        """Settle every whole frame that has come in; with `block`, wait for the child to finish first."""
        if self.failed:
            return
        os.set_blocking(self.fd, block)
        while not self.eof:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                self.eof = True
            self.buf += data
        while len(self.buf) >= _FRAME.size:
            (n,) = _FRAME.unpack_from(self.buf)
            if len(self.buf) < _FRAME.size + n:
                break
            try:
                found: list[_Found] = marshal.loads(bytes(self.buf[_FRAME.size : _FRAME.size + n]))
                del self.buf[: _FRAME.size + n]
                for i, files, groups, changed, unreadable in found:
                    item = self.share[i]
                    if item is None or files != len(item[1]):
                        raise ValueError("a reader's answer does not match its share")
                    size, recs = item
                    g.settle_small(
                        size,
                        files,
                        [(digest, [recs[j] for j in js]) for digest, js in groups],
                        [recs[j] for j in changed],
                        [recs[j] for j in unreadable],
                    )
                    self.share[i] = None  # its unique files' records are freed now
                    self.settled += files
            except (EOFError, ValueError, TypeError, IndexError):
                self.failed = True  # what is left of its share is read again by the parent
                return


def _read_small(
    dirs: list[bytes], small: list[tuple[int, list[bytes]]], g: _Grouper, procs: int, progress: Progress | None
) -> None:
    """Read and settle every small candidate, in this process or split over `procs` processes.

    Not on threads: four short system calls a file hand the interpreter lock back and forth, and on an idle
    2-core machine two threads burned 17 s of CPU for 12 s of wall where one needs ~7 s for both
    (docs/storage_benchmark.md, 2026-12-01 01:18 UTC). With more than one CPU and at least `_FORK_MIN`
    files, forked children each read a share of the size groups exactly as this process reads its own, and
    send back, as they go, only the duplicates they found and the files that changed or could not be read.
    A child that fails or is killed leaves the rest of its share to this process, which reads it again. No
    fork while other threads run (a child would inherit their locks held).
    """
    total = sum(len(recs) for _size, recs in small)
    readers: list[_Reader] = []
    own: list[tuple[int, list[bytes]]] = small
    if procs > 1 and total >= _FORK_MIN and hasattr(os, "fork") and threading.active_count() == 1:
        shares: list[list[tuple[int, list[bytes]]]] = [[] for _ in range(min(procs, _MAX_PROCS))]
        loads = [0] * len(shares)
        for item in small:  # whole size groups, to the share with the fewest files so far
            k = loads.index(min(loads))
            shares[k].append(item)
            loads[k] += len(item[1])
        small.clear()
        own = shares[0]
        try:
            for share in shares[1:]:
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:  # the child: never returns, never runs the parent's cleanup or flushes its buffers
                    code = 1
                    try:
                        os.close(r)
                        _child(dirs, share, w)
                        code = 0
                    finally:
                        os._exit(code)
                os.close(w)
                mine: _Share = list(share)
                readers.append(_Reader(pid, r, mine))
            del shares, share  # each child's share lives on in its reader only, freed as it is settled
            _read_own(dirs, own, g, readers, total, progress)
            for reader in readers:
                reader.drain(g, block=True)
                if reader.failed:  # an answer that does not parse: stop it, whatever it is doing
                    with contextlib.suppress(OSError):
                        os.kill(reader.pid, signal.SIGKILL)
                os.waitpid(reader.pid, 0)
                reader.pid = 0
                left = [item for item in reader.share if item is not None]
                reader.share.clear()
                _read_own(dirs, left, g, [], total, None)
        finally:
            for reader in readers:  # interrupted (Ctrl-C, an error): no child outlives the scan
                if reader.pid:
                    with contextlib.suppress(OSError):
                        os.kill(reader.pid, signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        os.waitpid(reader.pid, 0)
                with contextlib.suppress(OSError):
                    os.close(reader.fd)
        if progress is not None:
            progress("hashing small files", total, total)
        return
    _read_own(dirs, own, g, readers, total, progress)


def _read_own(
    dirs: list[bytes],
    share: list[tuple[int, list[bytes]]],
    g: _Grouper,
    readers: list[_Reader],
    total: int,
    progress: Progress | None,
) -> None:
    """`_small_groups` over size groups popped from `share` as they go (the records of files that turned out
    unique are freed mid-scan); every `_PROGRESS` files the readers' frames are settled and progress told."""
    done = last = 0
    share.reverse()
    while share:
        size, recs = share.pop()
        changed: list[bytes] = []
        unreadable: list[bytes] = []
        g.settle_small(size, len(recs), _small_groups(dirs, size, recs, changed, unreadable), changed, unreadable)
        done += len(recs)
        if done - last >= _PROGRESS:
            last = done
            for reader in readers:
                reader.drain(g, block=False)
            if progress is not None:
                progress("hashing small files", done + sum(r.settled for r in readers), total)
    if progress is not None:
        progress("hashing small files", done + sum(r.settled for r in readers), total)
