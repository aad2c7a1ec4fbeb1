"""Step time of a job on any catalog GPU, from the job's own ops (plan/ops/) costed on the card's roofline.

Each op takes the longest of:
- its FLOPs at the card's dense peak for its arithmetic (bf16/fp16 tensor cores, TF32 for fp32 convolutions,
  the fp32 pipes for fp32 matmuls) times an achieved efficiency. For GEMMs the efficiency depends on the shape:
  `eff = mm_eff · Π_d d/(d + d0)` over d in (M, N, K), so small and skinny GEMMs (LoRA's rank-r products,
  tiny batches) run far below peak; fused attention kernels run at `attn_eff · S/(S + attn_s0)` of the peak
  (S: keys per query);
- its bytes at the card's HBM bandwidth times `bw_eff`;
- its kernel launches times `launch_s` (the shortest a kernel takes on the device).
The host issues the kernels ahead of the device: a step (a decode step in generation) takes at least its
kernel count times `host_s`, eager PyTorch's host cost per op (what makes HF generate host-bound).
Several GPUs add collective bytes at the link's bandwidth (catalog `link_gbs`, per direction = half the
bidirectional figure), overlapped as the framework overlaps them: DDP all-reduces gradient buckets during the
backward pass (only what exceeds the backward time, and at least the last bucket, is exposed); FSDP2 prefetches
the next layer's all-gather during compute (what exceeds the compute is exposed, and at least the first gather).

The few constants (mm_eff, fp32_eff, d0, attn_eff, attn_s0, bw_eff, launch_s, conv_eff, conv_tf32_eff, host_s)
are fitted on the H200 training rows that
recorded step_seconds (`python benchmarks/steptime.py --fit`, written to plan/data/steptime_fit.json with
the rows, date and command; the fit and held-out errors are in docs/steptime.md). Other cards use the same
constants on their own datasheet peaks and bandwidth; a card's own measurements (trial/bench records in the
results database, plan/calibrate.py) scale its step time by the median measured/predicted ratio.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from gpuready.catalog import Gpu
from gpuready.models import ModelSpec, resolve_model
from gpuready.plan.ops import Op, lm_decode_ops, lm_ops, training_ops, vision_ops
from gpuready.units import GB
from gpuready.workload import Workload


@dataclass(frozen=True)
class Efficiency:
    mm_eff: float  # best share of the tensor-core peak a large GEMM reaches
    fp32_eff: float  # the same for fp32 GEMMs on the fp32 pipes
    d0: float  # GEMM dimension at which the efficiency halves (per dimension)
    attn_eff: float  # fused attention kernels' share of peak
    bw_eff: float  # achieved share of HBM (and link) bandwidth
    launch_s: float  # host seconds per kernel launch in eager PyTorch
    conv_eff: float  # best share of the 16-bit peak a cuDNN convolution reaches (NCHW tensors, PyTorch defaults)
    conv_tf32_eff: float  # the same for fp32 convolutions on TF32 tensor cores (cuDNN picks other kernels)
    host_s: float  # host seconds per op in eager PyTorch (bounds host-bound steps, e.g. decoding)
    attn_s0: float  # keys per query at which a fused attention kernel reaches half of attn_eff
    # host seconds per kernel of a decode step in HF generate(), warm (every shape seen before): the step is
    # host-bound, the GPU idle most of it (docs/calibration/gen_speed_h200.tsv: kernels 2.7-36 ms of 18-88 ms steps)
    decode_host_s: float

    def to_json(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in PARAM_NAMES}


# NCCL's achieved share of the link's one-way bandwidth (bus bandwidth / link bandwidth), per collective; measured
# on the 2 x H200 machine (docs/calibration/nccl_h200x2.json, benchmarks/steptime.py --nccl: 256 MiB of bf16) and
# copied into plan/data/steptime_fit.json by the fit.
@functools.cache
def link_eff() -> dict[str, float]:
    text = resources.files("gpuready.plan").joinpath("data/steptime_fit.json").read_text(encoding="utf-8")
    return {k: float(v) for k, v in json.loads(text).get("link_eff", {}).items()}


PARAM_NAMES = (
    "mm_eff",
    "fp32_eff",
    "d0",
    "attn_eff",
    "bw_eff",
    "launch_s",
    "conv_eff",
    "conv_tf32_eff",
    "host_s",
    "attn_s0",
    "decode_host_s",
)


@functools.cache
def fitted() -> Efficiency:
    """The constants fitted on the H200 rows (plan/data/steptime_fit.json, written by benchmarks/steptime.py)."""
    text = resources.files("gpuready.plan").joinpath("data/steptime_fit.json").read_text(encoding="utf-8")
    data = json.loads(text)
    return Efficiency(**{k: float(data["params"][k]) for k in PARAM_NAMES})


@dataclass(frozen=True)
class StepTime:
    """One optimizer step (training: grad_accum micro-batches on every GPU) or one request (inference: prefill
    of batch x seq, then new_tokens decode steps) of a job on `gpus` cards of one model."""

    gpu: str
    gpus: int
    seconds: float
    units_per_step: int  # tokens (trained, or generated; prefill: prompt tokens) or images, over all GPUs
    unit: str  # "tokens" or "images"
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds by op class (before calibration)
    calibration: float = 1.0  # measured/predicted factor applied for this card (1.0: none recorded)
    notes: tuple[str, ...] = ()

    @property
    def units_per_second(self) -> float:
        return self.units_per_step / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "seconds": self.seconds,
            "units_per_step": self.units_per_step,
            "unit": self.unit,
            "units_per_second": self.units_per_second,
            "breakdown": self.breakdown,
            "calibration": self.calibration,
            "notes": list(self.notes),
        }


def _peak(gpu: Gpu, math_kind: str, precision: str) -> tuple[float, str | None]:
    """TFLOP/s for this arithmetic on this card, and a note where the card lacks the unit the job asks for."""
    fp32 = gpu.fp32_tflops or 0.0
    if math_kind == "fp32":
        return fp32, None
    if math_kind == "tf32":
        if gpu.tf32_dense_tflops:
            return gpu.tf32_dense_tflops, None
        return fp32, f"{gpu.name} has no TF32 tensor cores: fp32 convolutions at the fp32 rate"
    if precision == "fp16":
        if gpu.fp16_dense_tflops:
            return gpu.fp16_dense_tflops, None
        return fp32, f"{gpu.name}: no fp16 tensor-core figure; fp32 rate used"
    if gpu.bf16_dense_tflops:
        return gpu.bf16_dense_tflops, None
    return fp32, f"{gpu.name} has no bf16 tensor cores: bf16 matmuls at the fp32 rate (use --precision fp16)"


# The constants are fitted on an NVIDIA H200. Best-shape bf16 matmuls reach 668/1300 TFLOP/s on the MI300X
# (ROCm 6.3) against 795/989 on the H100 SXM (stas00, ml-engineering compute/accelerator/README.md, "MAMF"
# table); AMD cards get their matmul efficiencies scaled by that ratio.
VENDOR_MATMUL_SCALE = {"AMD": (668 / 1300) / (795 / 989)}


def _gemm_eff(eff: Efficiency, op: Op) -> float:
    if op.name == "conv":
        base = eff.conv_tf32_eff if op.math == "tf32" else eff.conv_eff
    else:
        base = eff.fp32_eff if op.math == "fp32" else eff.mm_eff
    shape = 1.0
    for d in (op.m, op.n, op.k):
        shape *= d / (d + eff.d0)
    return base * shape


# A fused attention kernel given a mask tensor computes the whole square and reads the mask, at a rate the fitted
# curve (reached by the causal kernels) does not: benchmarks/attn_speed.py on the H200 (docs/calibration/
# attn_speed_h200.tsv, 2026-12-02, batch 1, 32 heads of 128, bf16, the sliding-window mask transformers builds):
# cuDNN's kernel with the mask, forward + backward, 240-309 TFLOP/s at 2k-32k tokens (the dispatcher's choice:
# 243-307), where its causal kernel reached 270-545 and the fitted curve gives 314-565. Measured, not fitted: the
# median of the masked forward + backward rates at 4k-32k, over the H200's 989 TFLOP/s.
MASKED_ATTN_SHARE = 0.30


def op_seconds(op: Op, gpu: Gpu, eff: Efficiency, precision: str, notes: set[str] | None = None) -> float:
    """Seconds of one op on one card (comm ops: the transfer alone; overlap is decided by `step_time`)."""
    bw = (gpu.mem_bw_gbs or 0.0) * GB * eff.bw_eff
    host = op.kernels * eff.launch_s
    if op.kind == "comm":
        link = (gpu.link_gbs or 0.0) * GB / 2 * link_eff().get(op.collective, 1.0)
        return op.bytes / link if link > 0 else math.inf
    mem = op.bytes / bw if bw > 0 else math.inf
    if op.kind == "memory":
        return max(mem, host)
    peak, note = _peak(gpu, op.math, precision)
    if note and notes is not None:
        notes.add(note)
    share = eff.attn_eff * (eff.fp32_eff / eff.mm_eff if op.math == "fp32" else 1.0)
    if op.kind == "attention" and op.n:
        share *= op.n / (op.n + eff.attn_s0)  # short key spans leave the fused kernel's tiles part-empty
    if op.masked and op.math == "half":  # (measured in bf16 only; fp32 masks take the memory-efficient kernel)
        share = min(share, MASKED_ATTN_SHARE)
    if op.kind == "matmul":
        share = _gemm_eff(eff, op)
    share *= VENDOR_MATMUL_SCALE.get(gpu.vendor, 1.0)
    compute = op.flops / (peak * 1e12 * share) if peak > 0 and share > 0 else math.inf
    return max(compute, mem, host)


def _sum(ops: Iterable[Op], gpu: Gpu, eff: Efficiency, precision: str, notes: set[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for op in ops:
        out[op.name] = out.get(op.name, 0.0) + op_seconds(op, gpu, eff, precision, notes)
    return out


def _host_bound(ops: Iterable[Op], eff: Efficiency, gpu_seconds: float, per_op: float | None = None) -> float:
    """Seconds the device waits for the host: kernel launches times host_s (or `per_op`: decode_host_s for a decode
    step; a loop of bare tensor ops, such as an optimizer's per-parameter step, launch_s) beyond the device's own
    time."""
    ops = [op for op in ops if op.kind != "comm"]
    module = eff.host_s if per_op is None else per_op
    host = sum(op.kernels * (module if op.module_ops else eff.launch_s) for op in ops)
    return max(0.0, host - gpu_seconds)


def _decode_host(ops: Iterable[Op], gpu: Gpu, eff: Efficiency, precision: str) -> tuple[float, float]:
    """(seconds a decode step's device waits for the host, seconds of the step the host sets), kernel by kernel:
    each kernel takes at least the host's decode_host_s to issue, so a kernel shorter than that leaves the device
    idle for the rest and lasts decode_host_s in all (generate() syncs every step, so the host cannot run a step
    ahead). Counted per kernel rather than as the step's host total against its device total: with the totals the
    small batches came out up to x1.5 slow and the large ones x0.85 (docs/steptime.md, session 21)."""
    idle = host_set = 0.0
    for op in ops:
        if op.kind == "comm" or op.kernels <= 0:
            continue
        per_kernel = op_seconds(op, gpu, eff, precision) / op.kernels
        if per_kernel < eff.decode_host_s:
            idle += op.kernels * (eff.decode_host_s - per_kernel)
            host_set += op.kernels * eff.decode_host_s
    return idle, host_set


def _exposed_comm(w: Workload, comm: list[Op], compute: float, backward: float, gpu: Gpu, eff: Efficiency) -> float:
    if not comm:
        return 0.0
    total = sum(op_seconds(op, gpu, eff, w.precision) for op in comm)
    if w.shard in ("fsdp", "zero3"):
        first = total / max(1.0, sum(op.kernels for op in comm))  # one layer's gather before compute starts
        return max(total - compute, first)
    last_bucket = total / max(1.0, comm[0].kernels)
    return max(total - backward, last_bucket)


def training_breakdown(
    all_ops: list[Op], w: Workload, gpu: Gpu, eff: Efficiency, notes: set[str] | None = None
) -> dict[str, float]:
    """Seconds by op class of one training step from its ops (plan/ops/ `training_ops`)."""
    notes = notes if notes is not None else set()
    comm = [o for o in all_ops if o.kind == "comm"]
    work = [o for o in all_ops if o.kind != "comm"]
    breakdown = _sum(work, gpu, eff, w.precision, notes)
    compute = sum(breakdown.values())
    waiting = _host_bound(work, eff, compute)
    if waiting > 0:
        breakdown["host (exposed)"] = waiting
        compute += waiting
    # backward is about two thirds of a step's compute (twice the forward's GEMMs)
    exposed = _exposed_comm(w, comm, compute, compute * 2 / 3, gpu, eff)
    if comm:
        breakdown["comm (exposed)"] = exposed
    return breakdown


# Decoding is timed warm: every shape seen before. On Hopper and Blackwell, SDPA tries cuDNN's attention first where
# PyTorch's cuDNN is newer than 9.15 (sdp_utils.cpp check_prefer_cudnn_attention, in PyTorch since 2.10; the 2.11
# wheels bundle cuDNN 9.19), and cuDNN builds an execution plan for every new shape, so each decode step of a
# request longer than any before it builds one (a new key length). benchmarks/gen_speed.py on the H200 (torch 2.11,
# cuDNN 9.19; docs/calibration/gen_speed_h200.tsv): a first generate() call took 1.2-8.9x the same call again, 18-146 ms
# more per new token, and with enable_cudnn_sdp(False) the first call was as fast as the second.
FIRST_REQUEST_NOTE = (
    "decode time is warm: on Hopper and Blackwell cards recent PyTorch (2.11: cuDNN 9.19) runs attention through "
    "cuDNN, which builds a plan for each new sequence length, so a request longer than any before it took 1.2-8.9x "
    "as long on the H200 (torch.backends.cuda.enable_cudnn_sdp(False) avoids that)"
)


def _cudnn_attention_first(gpu: Gpu) -> bool:
    """Whether SDPA takes cuDNN's kernel first on `gpu` with recent PyTorch (compute capability 9.x or 10.x)."""
    cc = gpu.compute_capability
    return cc is not None and cc.split(".", 1)[0] in ("9", "10")


def step_time(
    workload: Workload,
    gpu: Gpu,
    *,
    spec: ModelSpec | None = None,
    eff: Efficiency | None = None,
    calibration: float = 1.0,
) -> StepTime:
    """Predicted time of one step of `workload` on `workload.gpus` cards like `gpu` (see module docstring).

    Training: one optimizer step (grad_accum micro-batches on each GPU, the optimizer, the collectives).
    Inference: one request: prefill of batch x seq tokens, then new_tokens decode steps (memory-bound: weights
    and the KV cache read per token). `calibration` multiplies the result (a card's measured/predicted factor).
    """
    spec = spec or resolve_model(workload.model)
    eff = eff or fitted()
    w = workload
    notes: set[str] = set()
    host_set = 0.0  # seconds of decode set by the host (_decode_host)
    vision = spec.kind == "vision"
    unit = "images" if vision else "tokens"
    if w.training:
        breakdown = training_breakdown(training_ops(spec, w), w, gpu, eff, notes)
        per_gpu = w.batch * w.grad_accum * (1 if vision else w.seq)
        units = per_gpu * w.gpus
    elif vision:
        ops = vision_ops(spec, w)
        breakdown = _sum(ops, gpu, eff, w.precision, notes)
        breakdown["host (exposed)"] = _host_bound(ops, eff, sum(breakdown.values()))
        units = w.batch * w.gpus
    else:
        ops = lm_ops(spec, w)
        breakdown = _sum(ops, gpu, eff, w.precision, notes)
        breakdown["host (exposed)"] = _host_bound(ops, eff, sum(breakdown.values()))
        breakdown = {f"prefill {k}": v for k, v in breakdown.items()}
        units = w.batch * w.seq * w.gpus
        if w.new_tokens:
            # decode steps read the weights and a KV cache that grows from seq to seq + new_tokens; the middle
            # step's cost times the step count
            mid = w.seq + w.new_tokens // 2
            dops = lm_decode_ops(spec, w, mid)
            decode = _sum(dops, gpu, eff, w.precision, notes)
            decode["host (exposed)"], step_host_set = _decode_host(dops, gpu, eff, w.precision)
            host_set += step_host_set * w.new_tokens
            for k, v in decode.items():
                breakdown[f"decode {k}"] = v * w.new_tokens
            units = w.batch * w.new_tokens * w.gpus
            if _cudnn_attention_first(gpu):
                notes.add(FIRST_REQUEST_NOTE)
    total = sum(breakdown.values())
    # the time the host sets: its exposed wait, and in decode every kernel shorter than the host's cost to issue it
    exposed = (v for k, v in breakdown.items() if k.endswith("host (exposed)") and not k.startswith("decode"))
    host = host_set + sum(exposed)
    if total > 0 and host > 0.5 * total:
        notes.add(
            "host-bound: eager PyTorch's per-op cost on the CPU sets most of this step's time (e.g. HF generate's "
            "decode), so faster GPUs gain little and the machine's CPU counts (one request ran 27% apart on two H200 "
            "machines); a serving engine with CUDA graphs would not be"
        )
    seconds = total * calibration
    return StepTime(gpu.name, w.gpus, seconds, int(units), unit, dict(breakdown), calibration, tuple(sorted(notes)))
