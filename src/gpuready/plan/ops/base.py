"""The shared building blocks of the op lists: the `Op` record with its `Kind` and `Math` types, the `_Steps`
builder, the GEMM and memory-pass constructors, and a linear layer's forward and gradient GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gpuready.workload import Workload

Kind = Literal["matmul", "attention", "memory", "comm"]
# matmul/attention arithmetic: "half" = bf16/fp16 tensor cores, "tf32" = fp32 convolutions (cuDNN allows TF32 by
# default, torch.backends.cudnn.allow_tf32 = True), "fp32" = fp32 matmuls (torch.backends.cuda.matmul.allow_tf32
# is False by default, so cuBLAS runs them on the fp32 pipes)
Math = Literal["half", "tf32", "fp32"]


@dataclass(frozen=True)
class Op:
    """One kind of kernel in the step. flops and bytes are totals over `kernels` launches."""

    name: str  # op class for the breakdown: projections, lora, attention, elementwise, logits_loss, optimizer, ...
    kind: Kind
    flops: float = 0.0
    bytes: float = 0.0
    kernels: float = 1.0
    m: int = 0  # GEMM shape (matmul ops; per launch)
    n: int = 0
    k: int = 0
    math: Math = "half"
    collective: str = ""  # comm ops: all_reduce, all_gather or reduce_scatter
    # issued by the model's forward and backward, at eager PyTorch's host cost per op (steptime.py `host_s`); a
    # loop of bare tensor ops outside any module (an optimizer's per-parameter step) costs its launches only
    module_ops: bool = True
    # attention given a mask tensor (a sliding window past its length): the kernel runs at a lower rate
    # (steptime.py MASKED_ATTN_SHARE)
    masked: bool = False


def _gemm(
    name: str, m: int, n: int, k: int, e: int, math: Math, count: float = 1.0, kernels: float | None = None
) -> Op:
    """`count` GEMMs of [m, k] x [k, n] in elements of e bytes, in `kernels` launches (default: one each;
    a batched GEMM runs many in one)."""
    m, n, k = max(m, 1), max(n, 1), max(k, 1)
    launches = count if kernels is None else kernels
    return Op(
        name, "matmul", 2.0 * m * n * k * count, float(m * k + k * n + m * n) * e * count, launches, m, n, k, math
    )


def _mem(name: str, nbytes: float, kernels: float) -> Op:
    return Op(name, "memory", 0.0, float(nbytes), kernels)


@dataclass
class _Steps:
    """Builds the op list; `passes` repeats forward ops (checkpointing's recompute)."""

    ops: list[Op]

    def add(self, op: Op, times: float = 1.0) -> None:
        if times <= 0:
            return
        if times == 1.0:
            self.ops.append(op)
        else:
            self.ops.append(replace(op, flops=op.flops * times, bytes=op.bytes * times, kernels=op.kernels * times))


def _matmul_math(w: Workload) -> Math:
    return "fp32" if w.precision == "fp32" else "half"


def _linear(
    s: _Steps,
    name: str,
    m: int,
    k: int,
    n: int,
    e: int,
    math: Math,
    *,
    fwd: float,
    dgrad: bool,
    wgrad: bool,
    count: float = 1.0,
) -> None:
    """A linear layer x[m,k] @ W[k,n]: `fwd` forward passes (2 with checkpointing), input and weight gradients."""
    s.add(_gemm(name, m, n, k, e, math, count), fwd)
    if dgrad:
        s.add(_gemm(name, m, k, n, e, math, count))
    if wgrad:
        s.add(_gemm(name, k, n, m, e, math, count))
