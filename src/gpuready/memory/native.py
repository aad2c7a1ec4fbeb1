"""The compiled allocator replay (memory/_replay.c): built on first use with the machine's C compiler, kept in the
user's cache folder, loaded with ctypes. Where it cannot be built or loaded (no compiler, a read-only cache, another
platform), `replay_function()` returns None and memory/allocator.py runs its Python loop, which gives the same
results (tests/memory/test_native.py compares them) in about 30 times the time.

`GPUREADY_NATIVE=0` turns the compiled path off; `GPUREADY_CACHE` moves the cache folder (default
`$XDG_CACHE_HOME/gpuready`, else `~/.cache/gpuready`). The library's file is named by a hash of the source and the
machine, so a changed source is built again and never loads a stale library.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import zlib
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

SOURCE = Path(__file__).with_name("_replay.c")
STATS = 11  # int64 figures gr_replay writes (see _replay.c)
_ZERO = (0,)  # array("q", _ZERO) * n: n zeros (array("q", bytes(8 * n)) takes ~100x as long for large n)
ERRORS = {1: "freed twice", 2: "freed before it was allocated", 3: "the replay ran out of host memory"}

NativeReplay = Callable[[Sequence[int], int, tuple[int, int] | None], tuple[int, list[int]]]

_lock = threading.Lock()
_loaded: list[NativeReplay | None] = []  # [] until tried, then [function or None]
_lib: list[ctypes.CDLL] = []  # the loaded library, once loaded


class Instantiated:
    """gr_instantiate's outputs (see _replay.c) as Python values."""

    __slots__ = ("allocated", "events", "largest", "peak", "phase_first", "phase_peak", "phase_peak_event", "sizes")

    def __init__(self, nops: int, nh: int, nphases: int) -> None:
        self.events = array("q", _ZERO) * nops
        self.sizes = array("q", _ZERO) * nh
        self.phase_peak = array("q", [-1] * nphases)
        self.phase_peak_event = array("q", _ZERO) * nphases
        self.phase_first = array("q", _ZERO) * nphases
        self.allocated = self.peak = self.largest = 0


def instantiate(
    ops: array[int],
    a: array[int],
    c: array[int],
    batch: int,
    mark_at: array[int],
    mark_phase: array[int],
    nphases: int,
    load_phase: int,
) -> Instantiated | None:
    """Template.instantiate's loop compiled (None where the library is not there: the caller loops in Python)."""
    if replay_function() is None or not _lib:
        return None
    out = Instantiated(len(ops), len(a), nphases)
    figures = array("q", _ZERO) * 3

    rc = _lib[0].gr_instantiate(
        _addr(ops), len(ops), _addr(a), _addr(c), len(a), batch, _addr(mark_at), _addr(mark_phase), len(mark_at),
        load_phase, _addr(out.events), _addr(out.sizes), _addr(out.phase_peak), _addr(out.phase_peak_event),
        _addr(out.phase_first), _addr(figures),
    )  # fmt: skip
    if rc:
        raise ValueError(f"template ops name a handle the template does not have ({ERRORS.get(rc, rc)})")
    out.allocated, out.peak, out.largest = figures.tolist()
    return out


def _addr(buf: array[int]) -> int:
    """The address of an int64 array's data for the C functions (0 for an empty one)."""
    return buf.buffer_info()[0] if len(buf) else 0


def cache_dir() -> Path:
    root = os.environ.get("GPUREADY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpuready"
    )
    return Path(root) / "native"


def library_path(source: bytes) -> Path:
    """Where the library built from `source` is cached: named by the source's CRC-32 and length and the machine
    (a changed source gets a new name; zlib, not hashlib, to keep a run's start-up short)."""
    key = f"{zlib.crc32(source):08x}{len(source):x}-{platform.machine()}"
    return cache_dir() / f"replay-{key}.so"


def _compiler() -> str | None:
    import shutil

    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def build(source_path: Path = SOURCE) -> Path | None:
    """The compiled library for `source_path`, built now if the cache does not hold it; None when it cannot be."""
    import subprocess
    import tempfile

    try:
        source = source_path.read_bytes()
        target = library_path(source)
        if target.is_file():
            return target
        cc = _compiler()
        if cc is None or platform.system() == "Windows":
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        # built beside the target under a temporary name, then renamed: a concurrent run sees no half-written file
        fd, tmp = tempfile.mkstemp(prefix=".replay-", suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run(
                [cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(source_path)],
                capture_output=True,
                timeout=30,
                check=False,
            )
            if done.returncode != 0:
                return None
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _load(path: Path) -> NativeReplay:
    lib = ctypes.CDLL(str(path))
    fn = lib.gr_replay
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    inst = lib.gr_instantiate
    inst.restype = ctypes.c_int
    p, n = ctypes.c_void_p, ctypes.c_int64
    inst.argtypes = [p, n, p, p, n, n, p, p, n, n, p, p, p, p, p, p]
    live = lib.gr_live
    live.restype = ctypes.c_int
    live.argtypes = [p, n, p, p, n, p]
    _lib[:] = [lib]

    def run(events: Sequence[int], capacity_bytes: int, repeat: tuple[int, int] | None = None) -> tuple[int, list[int]]:
        evs = events if isinstance(events, array) and events.typecode == "q" else array("q", events)
        out = array("q", _ZERO) * STATS
        rep_from, rep_at = repeat if repeat is not None else (-1, -1)
        rc = fn(_addr(evs), len(evs), capacity_bytes, rep_from, rep_at, _addr(out))
        return rc, out.tolist()

    return run


def _build_and_load() -> NativeReplay | None:
    """Load the cached library; one that does not load (a damaged file) is removed and built again, once."""
    for _ in range(2):
        path = build()
        if path is None:
            return None
        try:
            return _load(path)
        except (OSError, AttributeError):  # not a loadable library, or not ours (no gr_replay)
            try:
                path.unlink()
            except OSError:
                return None
    return None


def live_by_code(events: array[int], end: int, codes: array[int], sizes: array[int], ncodes: int) -> list[int] | None:
    """Program.breakdown's pass compiled: bytes live after events[:end] by each handle's code (None where the
    library is not there)."""
    if replay_function() is None or not _lib:
        return None
    out = array("q", _ZERO) * ncodes

    rc = _lib[0].gr_live(_addr(events), min(end, len(events)), _addr(codes), _addr(sizes), len(sizes), _addr(out))
    if rc:
        raise ValueError("events name a handle the program does not have")
    return out.tolist()


def replay_function() -> NativeReplay | None:
    """The compiled replay, or None where it is off or cannot be had (then the Python loop runs)."""
    if _loaded:
        return _loaded[0]
    with _lock:
        if not _loaded:
            fn: NativeReplay | None = None
            if os.environ.get("GPUREADY_NATIVE", "1") != "0":
                fn = _build_and_load()
            _loaded.append(fn)
    return _loaded[0]


def reset() -> None:
    """Forget what was loaded (tests switch GPUREADY_NATIVE)."""
    with _lock:
        _loaded.clear()
        _lib.clear()
