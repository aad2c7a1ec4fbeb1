"""Traced mode: run the job's real code on fake tensors (no memory, no GPU) and replay its allocations
through the caching-allocator simulation (allocator.py).

How (../shared/calibration/README.md says how each measured job was run; this mirrors it):
- the model is built on the meta device (no initialisation, which reads values), LoRA adapters are added
  there by peft, and then every parameter and buffer is materialised as a fake CPU tensor, in module order;
- training runs `loss = model(input_ids, labels, use_cache=False).loss; loss.backward(); opt.step();
  opt.zero_grad(set_to_none=True)` for 3 steps with AdamW(foreach=True) or SGD(momentum=0.9, foreach=True)
  (CUDA takes the foreach path by default, the CPU does not: NOTES.md);
- inference runs prefill and decode steps with the model's forward and a DynamicCache, as `generate()`
  does (logits_to_keep=1, an fp32 copy of the last logits), without its data-dependent reads (NOTES.md);
  a few decode steps are traced and the rest extrapolated: every step repeats the same allocations, those
  that hold the cache growing by one token;
- a TorchDispatchMode records each new storage when an op returns it, and a weakref finalizer on the
  storage records its free; storages of 0 bytes are not allocations;
- what differs between CPU and CUDA kernels is modelled: scaled_dot_product_attention is replaced by what
  CUDA's flash or memory-efficient kernel keeps (output and log-sum-exp; the backward's fp32 accumulator),
  chosen by CUDA's rules, or the math path where CUDA would fall back to it; cuBLAS allocates one
  workspace through the caching allocator per handle (the forward thread and autograd's device thread).

The parts: trace_record.py records the allocations, trace_run.py runs the job, this module extends a
generation's trace, replays it and makes the result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpuready.errors import InputError
from gpuready.memory.allocator import CachingAllocator, round_size
from gpuready.memory.fit import Fit, Replayable, judge
from gpuready.memory.lm.ops import CUBLAS_WORKSPACE_BYTES
from gpuready.memory.result import MemoryEstimate
from gpuready.memory.trace_record import Trace
from gpuready.memory.trace_run import DECODE_STEPS_TRACED, TRAIN_STEPS, run_trace
from gpuready.models import resolve_model
from gpuready.search import largest_passing
from gpuready.units import MIB
from gpuready.workload import Workload

COMPONENTS = ("weights", "gradients", "optimizer_states", "activations", "kv_cache", "other")


def _extrapolate_decode(trace: Trace, total_steps: int) -> bool:
    """Extend a trace of prefill + k decode steps to `total_steps` decode steps, if the last two traced
    steps repeat the same allocations (sizes growing linearly with the cache). Returns False otherwise."""
    starts = {name: i for i, name in trace.marks}
    names = [name for _, name in trace.marks if name.startswith("decode")]
    if len(names) < 2 or total_steps <= len(names):
        return len(names) >= total_steps
    a0, a1 = starts[names[-2]], starts[names[-1]]
    end = starts.get("end", len(trace.events))
    prev, last = trace.events[a0:a1], trace.events[a1:end]
    if len(prev) != len(last):
        return False
    first_id_last = 1 + sum(1 for e in trace.events[:a1] if e > 0)
    first_id_prev = 1 + sum(1 for e in trace.events[:a0] if e > 0)
    n_alloc = sum(1 for e in last if e > 0)
    if n_alloc != sum(1 for e in prev if e > 0):
        return False
    # describe the last step relative to itself and the step before; check the step before matches
    template: list[tuple[str, int, int]] = []  # (kind, a, b)
    alloc_index = 0
    last_ids: list[int] = []
    for e_prev, e_last in zip(prev, last, strict=True):
        if (e_prev > 0) != (e_last > 0):
            return False
        if e_last > 0:
            template.append(("alloc", e_last, e_last - e_prev))
            last_ids.append(first_id_last + alloc_index)
            alloc_index += 1
        else:
            fid, pid = -e_last, -e_prev
            if fid >= first_id_last and pid >= first_id_prev and fid - first_id_last == pid - first_id_prev:
                template.append(("free_this", fid - first_id_last, 0))
            elif first_id_prev <= fid < first_id_last and pid < first_id_prev:
                template.append(("free_prev", fid - first_id_prev, 0))
            else:
                return False
    tail = trace.events[end:]
    del trace.events[end:]
    labels_last = [trace.labels[i] for i in last_ids]
    prev_ids = last_ids
    next_id = len(trace.labels)
    for step in range(len(names), total_steps):
        grow = step - len(names) + 1
        trace.marks.append((len(trace.events), f"decode{step}"))
        ids: list[int] = []
        for kind, a, b in template:
            if kind == "alloc":
                trace.events.append(a + grow * b)
                trace.labels.append(labels_last[len(ids)])
                trace.sizes.append(a + grow * b)
                ids.append(next_id)
                next_id += 1
            elif kind == "free_this":
                trace.events.append(-ids[a])
            else:
                trace.events.append(-prev_ids[a])
        prev_ids = ids
    # the frees at the end of the trace (after the loop) refer to the last traced step: point them at the last
    remap = dict(zip(last_ids, prev_ids, strict=True))
    trace.marks = [(i, n) for i, n in trace.marks if n != "end"] + [(len(trace.events), "end")]
    trace.events.extend(-remap.get(-e, -e) if e < 0 else e for e in tail)
    return True


# -- replay and result ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Replay:
    peak_allocated: int
    peak_reserved: int
    peak_event: int
    phases: dict[str, int]


def _replay(trace: Trace) -> _Replay:
    alloc = CachingAllocator()
    handles: list[Any] = [None]
    marks = sorted(trace.marks)
    mark_i = 0
    phase = "load"
    phases: dict[str, int] = {}
    peak_a, peak_event = 0, -1
    for i, ev in enumerate(trace.events):
        while mark_i < len(marks) and marks[mark_i][0] <= i:
            phase = _phase_name(marks[mark_i][1])
            mark_i += 1
        if ev > 0:
            handles.append(alloc.malloc(ev))
            if alloc.allocated > peak_a:
                peak_a, peak_event = alloc.allocated, i
            if alloc.allocated > phases.get(phase, 0):
                phases[phase] = alloc.allocated
        elif ev < 0:
            alloc.free(handles[-ev])
            handles[-ev] = None
    return _Replay(alloc.peak_allocated, alloc.peak_reserved, peak_event, phases)


def _phase_name(mark: str) -> str:
    return "decode" if mark.startswith("decode") or mark == "end" else mark


def _breakdown(trace: Trace, peak_event: int, peak_allocated: int) -> dict[str, int]:
    live: dict[int, int] = {}
    next_id = 1
    for ev in trace.events[: peak_event + 1]:
        if ev > 0:
            live[next_id] = ev
            next_id += 1
        elif ev < 0:
            live.pop(-ev, None)
    out = dict.fromkeys(COMPONENTS, 0)
    for aid, nbytes in live.items():
        out[trace.labels[aid] or "other"] += round_size(nbytes)
    out["other"] += peak_allocated - sum(out.values())  # whole blocks handed out unsplit
    return {k: v for k, v in out.items() if v}


def _phase_at(trace: Trace, index: int) -> str:
    phase = "load"
    for start, name in sorted(trace.marks):
        if start > index:
            break
        phase = _phase_name(name)
    return phase


@dataclass
class _Traced:
    job: Any
    rep: _Replay
    reserved: int
    notes: list[str]
    seconds: float
    largest_request: int  # the largest single allocation after loading


def _largest_request(trace: Trace) -> int:
    start = min((i for i, name in trace.marks if _phase_name(name) != "load"), default=0)
    return max((ev for ev in trace.events[start:] if ev > 0), default=0)


def _traced(workload: Workload) -> _Traced:
    start = time.perf_counter()
    job = run_trace(workload)
    trace = job.trace
    notes = list(job.notes)
    if not workload.training and workload.new_tokens > 1:
        if _extrapolate_decode(trace, workload.new_tokens - 1):
            notes.append(
                f"decode: {DECODE_STEPS_TRACED} steps traced, the other "
                f"{workload.new_tokens - 1 - DECODE_STEPS_TRACED}"
                " extrapolated (each step repeats its allocations, the cache one token longer)"
            )
        else:
            notes.append(f"decode: only {DECODE_STEPS_TRACED} steps traced; later steps not modelled")
    rep = _replay(trace)
    reserved = rep.peak_reserved
    spec = resolve_model(workload.model)
    if spec.model_type == "resnet":
        # cuDNN's workspaces come from the caching allocator on the GPU, not on CPU: a cached-workspace term
        # (memory/vision.py; the arithmetic mode makes each workspace where its convolution runs)
        from gpuready.memory.vision import cudnn_workspace_bytes

        reserved = max(reserved, rep.peak_allocated + cudnn_workspace_bytes(spec, workload))
        notes.append("cuDNN convolution workspace: one cached segment of a few feature maps (measured)")
    return _Traced(job, rep, reserved, notes, time.perf_counter() - start, _largest_request(trace))


def _traced_fit(workload: Workload, traced: _Traced, gpu_memory_bytes: int) -> Fit:
    """The traced job on a card, by the fit rule of both modes (memory/fit.py)."""
    from gpuready.memory.estimate import device_overhead_bytes, margin_kind

    events = traced.job.trace.events
    return judge(
        gpu_memory_bytes,
        device_overhead_bytes(workload),
        margin_kind(resolve_model(workload.model), workload),
        largest_request=traced.largest_request,
        unlimited_reserved=traced.rep.peak_reserved,
        peak_allocated=traced.rep.peak_allocated,
        extra_reserved=traced.reserved - traced.rep.peak_reserved,
        events=lambda: Replayable(events),
    )


def traced_largest_batch(
    workload: Workload, gpu_memory_bytes: int, guess: int, known: dict[int, Fit] | None = None
) -> tuple[int, int]:
    """Largest batch whose trace fits the card by the fit rule of both modes, searched from the arithmetic mode's
    answer `guess` (gpuready/search.py): usually two traces (the guess and the batch above it). Returns (batch,
    how many batch sizes were traced)."""
    from gpuready.memory.estimate import MAX_BATCH, MAX_BATCH_CHECKED

    fits = dict(known or {})

    def test(batch: int) -> bool:
        if batch not in fits:
            w = workload.model_copy(update={"batch": batch})
            fits[batch] = _traced_fit(w, _traced(w), gpu_memory_bytes)
        return fits[batch].fits

    found = largest_passing(test, 1, MAX_BATCH, start=max(guess, 1), check_below=MAX_BATCH_CHECKED)
    return max(found.value, 0), len(fits)


def trace_estimate(
    workload: Workload, gpu_memory_bytes: int | None = None, *, find_max_batch: bool = True
) -> MemoryEstimate:
    """Peak GPU memory of one job on one GPU: its traced allocations replayed through the allocator model.
    With `gpu_memory_bytes`: `fits` and headroom by the fit rule of both modes (memory/fit.py: the traced events
    replayed under the card's limit) and `max_batch` found by tracing around the arithmetic mode's answer."""
    if workload.gpus > 1 or workload.shard != "none":
        raise InputError("--gpus", "the traced mode covers one GPU; use --gpus 1 --shard none")
    if workload.method == "qlora":
        raise InputError("--method", "qlora is not traced (bitsandbytes needs CUDA); allowed: full, lora")
    if workload.decoding == "sample" and workload.new_tokens and not workload.training:
        # top-p's torch.sort takes its scratch inside the CUDA kernels' cub calls, which fake tensors never make
        # (memory/lm/sampling.py models them from the recorded histories)
        raise InputError(
            "--decoding",
            "sampling is not traced (top-p's sort scratch is made inside CUDA's kernels); allowed with --trace: "
            "greedy, or drop --trace",
        )
    if workload.training and workload.precision in ("bf16", "fp16") and workload.model.startswith("resnet"):
        # CPU convolution kernels keep fp32 copies of 16-bit activations that cuDNN does not: resnet50 bf16 batch
        # 128 traced at 12.65 GiB against 6.83 measured (docs/accuracy_trace.md)
        raise InputError(
            "--precision",
            f"{workload.precision} convolution training is not traced (CPU kernels keep fp32 copies cuDNN does not); "
            "allowed here: fp32, mixed, or drop --trace",
        )
    from gpuready.memory.estimate import device_overhead_bytes, largest_batch, margin_kind, with_fit

    traced = _traced(workload)
    job, rep, reserved, notes = traced.job, traced.rep, traced.reserved, traced.notes
    trace = job.trace
    overhead = device_overhead_bytes(workload)
    peak_device = reserved + overhead
    fit = max_batch = None
    if gpu_memory_bytes is not None:
        fit = _traced_fit(workload, traced, gpu_memory_bytes)
        if find_max_batch:
            spec = resolve_model(workload.model)
            guess = largest_batch(spec, workload, gpu_memory_bytes)
            max_batch, traced_sizes = traced_largest_batch(workload, gpu_memory_bytes, guess, {workload.batch: fit})
            notes.append(f"max batch: {traced_sizes} batch sizes traced, starting from the arithmetic answer {guess}")
    assumptions = [
        "traced: the job's real code run on fake tensors (torch FakeTensorMode), allocations replayed "
        "through a model of PyTorch's CUDA caching allocator (default settings)",
        f"attention: CUDA's flash/memory-efficient SDPA kernels modelled (output + log-sum-exp kept); "
        f"cuBLAS workspace {CUBLAS_WORKSPACE_BYTES // MIB} MiB per handle (sm90 default)",
        f"device overhead (CUDA context, libraries) {overhead} B, measured on an H200 with torch 2.11",
        f"traced in {traced.seconds:.1f} s, {len(trace.events)} allocation events",
        *notes,
    ]
    if workload.training:
        assumptions.insert(1, f"{TRAIN_STEPS} optimizer steps, {workload.optim} foreach, zero_grad(set_to_none)")
    result = MemoryEstimate(
        model=workload.model,
        params=job.params,
        trainable_params=job.trainable,
        peak_allocated_bytes=rep.peak_allocated,
        peak_reserved_bytes=reserved,
        peak_device_bytes=peak_device,
        phase=_phase_at(trace, rep.peak_event),
        breakdown=_breakdown(trace, rep.peak_event, rep.peak_allocated),
        assumptions=assumptions,
        mode="trace",
        phases=rep.phases,
        largest_request_bytes=traced.largest_request,
    )
    if fit is None:
        return result
    return with_fit(result, fit, max_batch, margin_kind(resolve_model(workload.model), workload))
