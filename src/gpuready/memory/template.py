"""A job's program for every batch at once: built one time with the batch as a symbol, then written out for any
batch by arithmetic (a max-batch search or a `plan` sweep asks for many batches of one job).

The program builders (memory/lm.py, memory/vision.py) are run once on a workload whose `batch` is `Batch()`, the
affine form `1 * batch + 0`. Their arithmetic carries it: every tensor size comes out as `a * batch + c` with
integer a and c. Whatever the builders do with it that is not exactly affine for every batch raises `NotAffine`
(no float products, no `int()`, a floor division only where it divides exactly, a comparison or branch only where
its answer is the same for every batch from 1 to MAX), and then the caller builds the program for its batch the
plain way. So a template exists only where every event of the program is the same op, on the same handle, at every
batch, with a size affine in the batch: `instantiate` then gives the same Program the builders would.
benchmarks/speed_check.py compares the two over a sweep of jobs and batches.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from typing import Any

from gpuready.memory import native
from gpuready.memory import program as program_module
from gpuready.memory.program import ROUND, Program

MAX = 1_000_000  # the largest batch a Workload allows (workload/spec.py); answers must hold on 1..MAX
# the batches the recording in progress (in this thread, as program.HOOKS) must hold on: 1..MAX, or 1..below-1 for
# a template of the batches below another's min_batch (build_template's `below`)
_RECORDING = threading.local()


def _range() -> tuple[int, int]:
    span: tuple[int, int] = getattr(_RECORDING, "span", (1, MAX))
    return span


class NotAffine(Exception):
    """The program's builders did something with the batch that is not the same for every batch."""


class Batch:
    """`a * batch + c` for every batch in 1..MAX (a, c integers)."""

    __slots__ = ("a", "c")

    def __init__(self, a: int = 1, c: int = 0) -> None:
        if type(a) is not int or type(c) is not int:
            raise NotAffine(f"coefficients {a!r}, {c!r}")
        self.a, self.c = a, c

    @staticmethod
    def _of(x: Any) -> Batch:
        if isinstance(x, Batch):
            return x
        if type(x) is int:
            return Batch(0, x)
        raise NotAffine(f"arithmetic with {type(x).__name__}")

    def at(self, batch: int) -> int:
        return self.a * batch + self.c

    def __add__(self, other: Any) -> Batch:
        o = Batch._of(other)
        return Batch(self.a + o.a, self.c + o.c)

    __radd__ = __add__

    def __sub__(self, other: Any) -> Batch:
        o = Batch._of(other)
        return Batch(self.a - o.a, self.c - o.c)

    def __rsub__(self, other: Any) -> Batch:
        return Batch._of(other) - self

    def __neg__(self) -> Batch:
        return Batch(-self.a, -self.c)

    def __pos__(self) -> Batch:
        return self

    def __mul__(self, other: Any) -> Batch:
        o = Batch._of(other)
        if self.a and o.a:
            raise NotAffine("batch times batch")
        return Batch(self.a * o.c + o.a * self.c, self.c * o.c)

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Batch:
        if type(other) is not int or other == 0 or self.a % other or self.c % other:
            raise NotAffine("floor division that does not divide exactly")
        return Batch(self.a // other, self.c // other)

    def _ends(self, other: Any) -> tuple[int, int]:
        """self - other at the range's first and last batch (1 and MAX unless the recording says otherwise): an affine
        difference is monotone, so a relation `d > 0`,
        `d >= 0`, `d < 0` or `d <= 0` that holds (or fails) at both ends holds (or fails) at every batch between."""
        d = self - Batch._of(other)
        first, last = _range()
        return d.at(first), d.at(last)

    def _decide(self, lo: bool, hi: bool) -> bool:
        if lo != hi:
            raise NotAffine("a comparison whose answer depends on the batch")
        return lo

    def __eq__(self, other: object) -> bool:
        d = self - Batch._of(other)
        if d.a == 0:
            return d.c == 0
        first, last = _range()
        if -d.c % d.a or not first <= -d.c // d.a <= last:
            return False  # no batch makes them equal
        raise NotAffine("an equality that holds at one batch only")

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __lt__(self, other: Any) -> bool:
        lo, hi = self._ends(other)
        return self._decide(lo < 0, hi < 0)

    def __le__(self, other: Any) -> bool:
        lo, hi = self._ends(other)
        return self._decide(lo <= 0, hi <= 0)

    def __gt__(self, other: Any) -> bool:
        lo, hi = self._ends(other)
        return self._decide(lo > 0, hi > 0)

    def __ge__(self, other: Any) -> bool:
        lo, hi = self._ends(other)
        return self._decide(lo >= 0, hi >= 0)

    def __bool__(self) -> bool:
        return self != 0

    def __hash__(self) -> int:
        return hash(("Batch", self.a, self.c))

    def __repr__(self) -> str:
        return f"Batch({self.a}, {self.c})"

    # everything else (int(), float products, **, %, divmod, indexing, range) raises TypeError: not affine
    def __int__(self) -> int:
        raise NotAffine("int() of the batch")

    __index__ = __int__

    def __float__(self) -> float:
        raise NotAffine("float() of the batch")

    def __truediv__(self, other: Any) -> Any:
        raise NotAffine("true division of the batch")

    __rtruediv__ = __truediv__
    __rfloordiv__ = __truediv__
    __mod__ = __truediv__
    __rmod__ = __truediv__
    __pow__ = __truediv__
    __rpow__ = __truediv__


class PerBatch:
    """A size that is not affine in the batch but is known for each one: `fn(batch)` bytes, positive at every batch
    or at none. The builder that makes it vouches that `fn` never falls as the batch grows (so the recorder, which
    checks batch 1 and MAX, knows whether the tensor exists at every batch); the template then computes its size
    per batch when it writes a program out (ops.reduce_buffer_bytes: a reduction's staging buffer)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[int], int]) -> None:
        self.fn = fn


class _Unknown:
    """What a Program's running figures (allocated, peaks, events, sizes) are while its batch is a symbol: any use
    of them raises, so a builder that reads them back cannot take a template."""

    def _refuse(self, *args: Any) -> Any:
        raise NotAffine("a running figure of the program read back while the batch is a symbol")

    __int__ = __index__ = __float__ = __bool__ = __len__ = __iter__ = __getitem__ = __contains__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __floordiv__ = __truediv__ = _refuse
    __neg__ = __setitem__ = __delitem__ = _refuse


UNKNOWN: Any = _Unknown()


class _Recorder:
    """Program's alloc/free/size_of/set_phase for a build with a symbolic batch (bound onto the Program)."""

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.a: list[int] = [0]  # handle -> bytes requested = a * batch + c
        self.c: list[int] = [0]
        self.ops: list[int] = []  # +handle allocates it, -handle frees it, 0 empties the cache
        self.phases: list[tuple[int, str]] = [(0, prog.phase)]  # (ops before, phase)
        self.steps: list[int] = []  # ops before each optimizer step (Program.mark_step)
        self.per_batch: dict[int, Callable[[int], int]] = {}  # handle -> its size at a batch (PerBatch)
        self.min_batch = 1  # the template holds from this batch up (a PerBatch tensor absent below it)

    def alloc(self, category: str, nbytes: Any) -> int:
        if isinstance(nbytes, PerBatch):
            lo, hi = _range()  # the first batch where it exists: the template then holds from there on
            if nbytes.fn(hi) <= 0:
                return 0  # (never falls: empty at the last batch, empty at every batch)
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if nbytes.fn(mid) > 0 else (mid + 1, hi)
            self.min_batch = max(self.min_batch, lo)
            handle = self.alloc(category, nbytes.fn(lo))
            self.per_batch[handle] = nbytes.fn
            return handle
        n = nbytes if isinstance(nbytes, Batch) else Batch(0, int(nbytes))
        if n.a == 0 and n.c <= 0:
            return 0  # no tensor at any batch
        if n.a < 0 or n.at(1) <= 0:
            raise NotAffine("a size that is empty at some batches")
        self.a.append(n.a)
        self.c.append(n.c)
        self.prog.categories.append(category)
        self.ops.append(len(self.a) - 1)
        return len(self.a) - 1

    def free(self, handle: int) -> None:
        if handle:
            self.ops.append(-handle)

    def empty_cache(self) -> None:
        self.ops.append(0)  # (written out as event 0 at every batch)

    def mark_step(self) -> None:
        self.steps.append(len(self.ops))  # (an op is an event at every batch)

    def from_batch(self, batch: Any, first: int) -> bool:
        if isinstance(batch, Batch):  # the program from `first` up; the builders make the smaller batches
            if first > _range()[1]:  # (a template of the batches below: all of them below `first`)
                return False
            self.min_batch = max(self.min_batch, first)
            return True
        return bool(batch >= first)

    def size_of(self, handle: int) -> int:
        if self.a[handle] or handle in self.per_batch:
            raise NotAffine("a batch-dependent size read back (rounding is not affine)")
        c = self.c[handle]
        return (c + ROUND - 1) // ROUND * ROUND if handle else 0

    def set_phase(self, name: str) -> None:
        self.prog.phase = name
        self.phases.append((len(self.ops), name))


@dataclass(frozen=True)
class Template:
    a: list[int]
    c: list[int]
    ops: list[int]
    phases: list[tuple[int, str]]
    categories: list[str]
    streams: dict[str, int]
    cached_outside_bytes: int
    steps: list[int]
    per_batch: dict[int, Callable[[int], int]] = field(default_factory=dict)  # handle -> size at a batch
    min_batch: int = 1  # the first batch it writes out (below it the builders make another program)
    cached_outside_per_batch: int = 0  # cached_outside_bytes grows by this much a batch
    max_batch: int = MAX  # the last (a template of the batches below another's min_batch stops below it)

    def _outside_at(self, batch: int) -> int:
        return self.cached_outside_bytes + self.cached_outside_per_batch * batch

    def _c_at(self, batch: int) -> array[int]:
        """The constant terms at `batch`: c, with each PerBatch handle's size at that batch in its place."""
        c = self._arrays[2]
        if not self.per_batch:
            return c
        c = array("q", c)
        for handle, fn in self.per_batch.items():
            c[handle] = fn(batch)
        return c

    @cached_property
    def _arrays(self) -> tuple[array[int], array[int], array[int], array[int], array[int], list[str]]:
        """ops, a, c and the phase marks as int64 arrays for the compiled loop (memory/native.py), and the phases'
        names by number."""
        names = list(dict.fromkeys(name for _, name in self.phases))
        number = {name: i for i, name in enumerate(names)}
        marks = array("q", [at for at, _ in self.phases])
        phases = array("q", [number[name] for _, name in self.phases])
        return array("q", self.ops), array("q", self.a), array("q", self.c), marks, phases, names

    @cached_property
    def _codes(self) -> tuple[list[str], array[int]]:
        """Program.category_codes of every program this template writes out (they share the categories)."""
        return Program(categories=list(self.categories)).category_codes()

    def instantiate(self, batch: int) -> Program:
        """The program at `batch` (at least min_batch): the one the builders make for it (module docstring)."""
        if not self.min_batch <= batch <= self.max_batch:
            raise ValueError(f"this template holds from batch {self.min_batch} to {self.max_batch}, not {batch}")
        ops, a, _, marks, phases, names = self._arrays
        c = self._c_at(batch)
        made = native.instantiate(
            ops, a, c, batch, marks, phases, len(names), names.index("load") if "load" in names else -1
        )
        if made is None:
            return self._instantiate_python(batch)
        prog = Program(
            sizes=made.sizes,
            categories=list(self.categories),
            streams=dict(self.streams),
            cached_outside_bytes=self._outside_at(batch),
            step_starts=list(self.steps),
        )
        prog.events = made.events  # (int64 arrays: the replay and the breakdown read them as they are)
        prog._names, prog._arrays["codes"] = self._codes
        # the phases in the order their peaks were first set, as the Python loop's dicts list them
        order = sorted((first, i) for i, first in enumerate(made.phase_first) if made.phase_peak[i] >= 0)
        prog.phase_peaks = {names[i]: made.phase_peak[i] for _, i in order}
        prog.phase_peak_events = {names[i]: made.phase_peak_event[i] for _, i in order}
        prog.allocated, prog.peak_allocated, prog.largest_request = made.allocated, made.peak, made.largest
        prog.set_phase(self.phases[-1][1])
        return prog

    def _instantiate_python(self, batch: int) -> Program:
        """instantiate's loop in Python (where the compiled one cannot be had)."""
        constant = self._c_at(batch)
        sizes = [0] + [
            (a * batch + c + ROUND - 1) // ROUND * ROUND for a, c in zip(self.a[1:], constant[1:], strict=True)
        ]
        prog = Program(
            sizes=sizes,
            categories=list(self.categories),
            streams=dict(self.streams),
            cached_outside_bytes=self._outside_at(batch),
            step_starts=list(self.steps),
        )
        events = prog.events
        append = events.append
        peaks = prog.phase_peaks
        peak_events = prog.phase_peak_events
        allocated = peak = largest = 0
        ops = self.ops
        # the phases' spans of ops: a mark at i switches before op i (of several marks at one i, the last holds);
        # each span is one loop with its phase's figures in locals
        marks = [*self.phases, (len(ops), "")]
        for (start, phase), (end, _) in pairwise(marks):
            if end <= start:
                continue
            phase_peak = peaks.get(phase, -1)
            loading = phase == "load"
            for i in range(start, end):
                op = ops[i]
                if op > 0:
                    size = sizes[op]
                    append(size)
                    allocated += size
                    if size > largest and not loading:
                        largest = size
                    if allocated > phase_peak:
                        phase_peak = peaks[phase] = allocated
                        peak_events[phase] = i + 1
                        if allocated > peak:
                            peak = allocated
                else:
                    append(op)
                    allocated -= sizes[-op]
        phase = marks[-2][1]
        prog.allocated, prog.peak_allocated, prog.largest_request = allocated, peak, largest
        prog.set_phase(phase)
        return prog


@contextmanager
def _recording() -> Iterator[list[_Recorder]]:
    made: list[_Recorder] = []

    def hook(prog: Program) -> None:
        rec = _Recorder(prog)
        for name in ("events", "sizes", "allocated", "peak_allocated", "phase_peaks", "phase_peak_events"):
            setattr(prog, name, UNKNOWN)
        prog.largest_request = UNKNOWN
        prog.alloc = rec.alloc  # type: ignore[method-assign]
        prog.free = rec.free  # type: ignore[method-assign]
        prog.empty_cache = rec.empty_cache  # type: ignore[method-assign]
        prog.mark_step = rec.mark_step  # type: ignore[method-assign]
        prog.from_batch = rec.from_batch  # type: ignore[method-assign]
        prog.size_of = rec.size_of  # type: ignore[method-assign]
        prog.set_phase = rec.set_phase  # type: ignore[method-assign]
        made.append(rec)

    hooks = program_module.HOOKS
    before = getattr(hooks, "on_new", None)
    hooks.on_new = hook
    try:
        yield made
    finally:
        hooks.on_new = before


def build_template(build: Callable[[Any], Program], workload: Any, below: int | None = None) -> Template | None:
    """`build(workload)` run once with the batch as a symbol; None where the program is not affine in the batch
    (or anything else goes wrong: the caller then builds the program for its batch). With `below`, the template of
    the batches under it only (those another template's min_batch leaves to the builders: a builder that takes
    another branch from some batch on, Program.from_batch)."""
    symbolic = workload.model_copy(update={"batch": Batch()})
    last = MAX if below is None else below - 1
    if last < 1:
        return None
    _RECORDING.span = (1, last)
    try:
        with _recording() as made:
            prog = build(symbolic)
        outside = prog.cached_outside_bytes
        if isinstance(outside, Batch):  # (a cached block that grows with the batch: ResNet training's floor)
            outside_per_batch, outside = outside.a, outside.c
        else:
            outside_per_batch = 0
        if len(made) != 1 or made[0].prog is not prog or type(outside) is not int:
            return None
        rec = made[0]
        return Template(
            rec.a,
            rec.c,
            rec.ops,
            rec.phases,
            prog.categories,
            dict(prog.streams),
            outside,
            list(rec.steps),
            dict(rec.per_batch),
            rec.min_batch,
            outside_per_batch,
            last,
        )
    except Exception:  # NotAffine, or a TypeError where a builder used the batch as an int: build per batch
        return None
    finally:
        del _RECORDING.span
