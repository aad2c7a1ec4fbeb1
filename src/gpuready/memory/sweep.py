"""One job at many batches (or sequence lengths, ...): the library's sweeps.

`estimate_batches(w, batches)` returns what `estimate()` returns for `w` at each batch, in the order asked
(tests/memory/test_sweep.py checks they are equal, field for field). The first two batches are estimated in the
calling thread; with more than two batches the job's batch template (memory/template.py) is recorded at the first
and every batch, the first too, is written out from it (one program build saved; the template's programs are the
builders' own, tests/memory/test_template.py). The rest are shared among threads: the template's write-out, the
allocator replay and the breakdown pass are compiled functions (memory/native.py) called through ctypes, which
releases the GIL while they run, so on a machine with several cores the replays of different batches run at the
same time. Where the compiled functions cannot be had, the threads give the same answers one after another.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from gpuready.errors import InputError
from gpuready.memory.estimate import estimate, expect_many_batches, fsdp_meta_init, template_for
from gpuready.memory.result import MemoryEstimate
from gpuready.models import ModelSpec, resolve_model
from gpuready.workload import Workload, make_workload
from gpuready.workload.validate import CheckedWorkload, check_workload, does_not_apply

# the workload fields a sweep may vary, one at a time (those `trial --sweep` measures: trial/sweep.py)
SWEEPABLE = ("batch", "seq", "new_tokens", "image_size", "lora_r", "grad_accum")
SERIAL_FIRST = 2  # batches estimated before the threads start: the program's build and the template's
T = TypeVar("T")
MAX_WORKERS = 8  # more threads than this gain nothing: the Python between the compiled calls holds the GIL


def default_workers() -> int:
    """Threads a sweep uses by default: the cores this process may run on, at most MAX_WORKERS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def _batches(batches: Iterable[int]) -> list[int]:
    """The batches as a list; InputError naming `batch` for one that is not a whole number of at least 1."""
    order = list(batches)
    for b in order:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InputError("batch", f"a whole number of at least 1, not {b!r}")
    return order


def estimate_batches(
    workload: Workload,
    batches: Iterable[int],
    gpu_memory_bytes: int | None = None,
    *,
    find_max_batch: bool = False,
    workers: int | None = None,
) -> list[MemoryEstimate]:
    """`estimate(workload at batch b, gpu_memory_bytes, find_max_batch=...)` for each b of `batches`, in order.

    `workers`: threads for the batches after the first two (default: the cores available, at most 8)."""
    order = _batches(batches)
    if workers is not None and workers < 1:
        raise InputError("workers", f"at least 1, not {workers!r}")
    spec = resolve_model(workload.model, workload.as_family)
    jobs = [workload.model_copy(update={"batch": b}) for b in order]
    if len(set(order)) > 2:  # enough batches that recording the template first saves a build
        expect_many_batches(spec, workload, fsdp_meta_init(spec, workload, gpu_memory_bytes))

    def one(w: Workload) -> MemoryEstimate:
        return estimate(w, gpu_memory_bytes, spec=spec, find_max_batch=find_max_batch)

    results: list[MemoryEstimate | None] = [None] * len(jobs)
    head = min(SERIAL_FIRST, len(jobs))
    for i in range(head):
        results[i] = one(jobs[i])
    rest = list(range(head, len(jobs)))
    threads = min(workers or default_workers(), len(rest))
    if threads > 1:  # the templates the threads will read, recorded once here rather than in each thread
        meta = fsdp_meta_init(spec, workload, gpu_memory_bytes)
        structure = workload.model_copy(update={"batch": 1})
        template_for(spec, structure, meta, min(order[i] for i in rest))
    if threads <= 1:
        for i in rest:
            results[i] = one(jobs[i])
        return [r for r in results if r is not None]

    def fill(i: int) -> None:
        results[i] = one(jobs[i])

    _on_threads(fill, rest, threads)
    return [r for r in results if r is not None]


def _on_threads(
    run: Callable[[T], None], items: list[T], threads: int, meanwhile: Callable[[], None] | None = None
) -> None:
    """run(item) for every item, the items dealt round-robin to `threads` threads; the first exception raised in a
    thread stops the others' next items and is raised here, in the caller's thread. `meanwhile`: run in the
    caller's thread while the others work (its exception is raised once they have stopped)."""
    errors: list[BaseException] = []

    def work(part: list[T]) -> None:
        for item in part:
            if errors:
                return
            try:
                run(item)
            except BaseException as exc:  # handed to the caller's thread below
                errors.append(exc)
                return

    pool = [threading.Thread(target=work, args=(items[k::threads],), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    try:
        if meanwhile is not None:
            meanwhile()
    except BaseException:
        errors.append(RuntimeError("stopped"))  # the threads take no next item
        raise
    finally:
        for t in pool:
            t.join()
    if errors:
        raise errors[0]


def estimate_cards(
    workload: Workload,
    capacities: Iterable[int],
    *,
    spec: ModelSpec | None = None,
    workers: int | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> dict[int, MemoryEstimate]:
    """`estimate(workload, c)` (fits and max batch) for each card capacity c, by capacity: what `plan` asks for every
    card of the catalog. The batch template the max-batch searches write out is recorded first, in the calling
    thread; then the cards share threads as estimate_batches' batches do (their replays under each card's limit run
    at the same time on several cores). `meanwhile`: other work for the calling thread while they run (plan's step
    times), called once in any case."""
    spec = spec or resolve_model(workload.model, workload.as_family)
    order = list(dict.fromkeys(capacities))
    out: dict[int, MemoryEstimate] = {}

    def fill(c: int) -> None:
        out[c] = estimate(workload, c, spec=spec)

    threads = min(workers or default_workers(), len(order))
    if threads <= 1:
        for c in order:
            fill(c)
        if meanwhile is not None:
            meanwhile()
        return out
    structure = workload.model_copy(update={"batch": 1})
    for meta in dict.fromkeys(fsdp_meta_init(spec, workload, c) for c in order):
        expect_many_batches(spec, workload, meta)
        template_for(spec, structure, meta, 1)
    _on_threads(fill, order, threads, meanwhile)
    return {c: out[c] for c in order}


def checked_sweep(workload: Workload, variable: str, values: Iterable[int]) -> list[CheckedWorkload]:
    """`workload` with `variable` set to each of `values`, each read against its model as the flags are
    (workload/validate.py: InputError for a value the model does not allow, warnings to show). InputError too for a
    variable that does not change this job."""
    if variable not in SWEEPABLE:
        raise InputError("--sweep", f"{variable!r}: one of {', '.join(SWEEPABLE)}")
    spec = resolve_model(workload.model, workload.as_family)
    why = does_not_apply(spec, workload, variable)
    if why:
        raise InputError("--sweep", why)
    order = list(values)
    if variable == "batch":
        return [CheckedWorkload(workload.model_copy(update={"batch": b}), spec) for b in _batches(order)]
    given = {name: getattr(workload, name) for name in workload.model_fields_set}
    return [check_workload(make_workload(**{**given, variable: v}), spec) for v in order]


def estimate_sweep(
    workload: Workload,
    variable: str,
    values: Iterable[int],
    gpu_memory_bytes: int | None = None,
    *,
    find_max_batch: bool = False,
    workers: int | None = None,
    checked: list[CheckedWorkload] | None = None,
) -> list[MemoryEstimate]:
    """`estimate()` of `workload` with `variable` set to each of `values`, in order. A batch sweep goes through
    estimate_batches (one program template, threads); any other variable is a new job per value, each read against
    its model as the flags are (checked_sweep: InputError for a value the job does not allow, or a variable that
    does not change the job). `checked`: checked_sweep's answer where the caller already has it (it shows their
    warnings)."""
    order = list(values)
    jobs = checked if checked is not None else checked_sweep(workload, variable, order)
    if variable == "batch":
        return estimate_batches(workload, order, gpu_memory_bytes, find_max_batch=find_max_batch, workers=workers)
    spec = jobs[0].spec if jobs else resolve_model(workload.model, workload.as_family)
    return [estimate(j.workload, gpu_memory_bytes, spec=spec, find_max_batch=find_max_batch) for j in jobs]
