"""Optimizer states and the step's temporaries, as PyTorch's and bitsandbytes' optimizers allocate them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuready.memory.program import Program

# bitsandbytes 8-bit blockwise optimizers (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"), as
# bitsandbytes 0.50.2's Optimizer2State.init_state makes a parameter's state on its first step (optim/optimizer.py,
# read in the wheel the H200 runs): state1 and state2 as uint8 tensors of the parameter's size, then absmax1 and
# absmax2, one fp32 per block of 256 elements; before the first of them the two quantization maps ("dynamic",
# "udynamic": 256 fp32 values each) are moved to the GPU once and kept. A parameter under min_8bit_size (4096
# elements) keeps two fp32 states instead. The update itself (optimizer_update_8bit_blockwise) works in place.
BNB_BLOCK = 256
BNB_MIN_8BIT = 4096
BNB_QMAP_BYTES = 256 * 4


@dataclass(frozen=True)
class Trainable:
    numel: int
    elem_bytes: int
    shape: tuple[int, ...] = ()  # the parameter's shape where known (Adafactor factors matrices by it)

    @property
    def nbytes(self) -> int:
        return self.numel * self.elem_bytes


def optimizer_step(prog: Program, optim: str, params: list[Trainable], state: list[int] | None) -> list[int]:
    """One optimizer step. Creates the states on the first step (state is None); returns the state handles."""
    first = state is None
    handles = list(state or [])
    if optim == "adamw":
        # torch.optim.AdamW: exp_avg and exp_avg_sq in the parameter's dtype, created lazily (zeros_like).
        # The default foreach path (_multi_tensor_adamw) computes exp_avg_sq.sqrt() for all parameters of a
        # dtype group at once: one parameter-sized temporary per group (NOTES.md: the 8B full fine-tune peaks
        # at 5.0x the bf16 weights = weights + grads + 2 states + this temporary).
        if first:
            handles.extend(prog.alloc_many("optimizer_states", [p.nbytes for p in params for _ in (0, 1)]))
        for group in _dtype_groups(params):
            prog.free_all(prog.alloc_many("optimizer_temporaries", [p.nbytes for p in group]))
    elif optim == "sgd":
        # SGD(momentum=0.9): one momentum buffer per parameter, a clone of the first gradient; in-place after
        if first:
            handles.extend(prog.alloc("optimizer_states", p.nbytes) for p in params)
    elif optim == "adamw8bit":
        if first:
            qmaps = False
            for p in params:
                if p.numel < BNB_MIN_8BIT:
                    handles.extend(prog.alloc("optimizer_states", 4 * p.numel) for _ in (0, 1))
                    continue
                if not qmaps:
                    handles.extend(prog.alloc("optimizer_states", BNB_QMAP_BYTES) for _ in (0, 1))
                    qmaps = True
                absmax = 4 * -(-p.numel // BNB_BLOCK)
                handles.extend(prog.alloc("optimizer_states", n) for n in (p.numel, p.numel, absmax, absmax))
    elif optim == "adafactor":
        _adafactor_step(prog, params, first, handles)
    return handles


def _factors(p: Trainable) -> tuple[int, int] | None:
    """The element counts of Adafactor's row and column statistics for `p` (None: a vector, whose second moment is
    kept whole). A parameter of unknown shape is taken as a square matrix from 4,096 elements up."""
    if len(p.shape) >= 2:
        return p.numel // p.shape[-1], p.numel // p.shape[-2]
    if p.shape or p.numel < 4096:
        return None
    side = math.isqrt(p.numel)
    return side, side


SCALAR = 4  # a 0-dim fp32 tensor (the allocator rounds it to 512 bytes)


def _adafactor_step(prog: Program, params: list[Trainable], first: bool, state: list[int]) -> None:
    """transformers.optimization.Adafactor.step as the HF Trainer builds it (beta1=None: no first moment), one
    parameter at a time, tensor by tensor as its code makes them: the gradient and the parameter copied to fp32
    when they are 16-bit; update = grad ** 2 + eps; the row and column statistics updated with the update's means
    (created on the first step, fp32); update = r_factor * c_factor (a full-size product; a vector's own second
    moment's rsqrt instead), times the gradient in place; its RMS clipped; -update added into the fp32 parameter,
    copied back. The step's locals (the fp32 gradient and parameter, the update) live until the next parameter
    rebinds them, and the RMS kept in the state (a 0-dim tensor) is replaced each step. `state` (the handles): on
    the first step each parameter's row and column statistics or whole second moment are appended, then every
    parameter's RMS; later steps replace the RMS handles (the last len(params))."""
    alloc, free = prog.alloc, prog.free
    stats: list[int] = []
    rms_handles = [0] * len(params) if first else state[len(state) - len(params) :]
    grad32 = p32 = update = 0
    for i, p in enumerate(params):
        n4 = 4 * p.numel
        half = p.elem_bytes < 4
        free(grad32)  # grad = p.grad rebinds it, then grad.float()
        grad32 = alloc("optimizer_temporaries", n4) if half else 0
        factors = _factors(p)
        if first:
            if factors is None:
                stats.append(alloc("optimizer_states", n4))
            else:
                stats.append(alloc("optimizer_states", 4 * factors[0]))
                stats.append(alloc("optimizer_states", 4 * factors[1]))
        free(p32)
        p32 = alloc("optimizer_temporaries", n4) if half else 0
        # state["RMS"] = p32.norm(2) / sqrt(numel): the norm, the quotient (kept), the norm freed, the old RMS freed
        norm = alloc("optimizer_temporaries", SCALAR)
        rms = alloc("optimizer_states", SCALAR)
        free(norm)
        free(rms_handles[i])  # (handle 0 on the first step: nothing)
        rms_handles[i] = rms
        squared = alloc("optimizer_temporaries", n4)
        plus_eps = alloc("optimizer_temporaries", n4)
        free(squared)
        free(update)  # the previous parameter's update, rebound
        if factors is None:
            product = alloc("optimizer_temporaries", n4)  # exp_avg_sq.rsqrt()
        else:
            rows, cols = factors
            prog.transient("optimizer_temporaries", 4 * rows)  # update.mean(dim=-1), added into the row statistics
            prog.transient("optimizer_temporaries", 4 * cols)  # update.mean(dim=-2)
            mean = alloc("optimizer_temporaries", SCALAR)  # _approx_sq_grad: the rows' mean,
            r_factor = alloc("optimizer_temporaries", 4 * rows)  # row / mean (rsqrt_ in place)
            free(mean)
            c_factor = alloc("optimizer_temporaries", 4 * cols)  # col.rsqrt()
            product = alloc("optimizer_temporaries", n4)  # r_factor * c_factor
            free(r_factor)
            free(c_factor)
        free(plus_eps)
        update = product
        prog.transient("optimizer_temporaries", SCALAR, SCALAR)  # the update's RMS over the clip threshold
        prog.transient("optimizer_temporaries", n4)  # -update, added into the fp32 parameter
    free(grad32)
    free(p32)
    free(update)
    if first:
        state.extend(stats + rms_handles)
    else:
        state[len(state) - len(params) :] = rms_handles


def _dtype_groups(params: list[Trainable]) -> list[list[Trainable]]:
    groups: dict[int, list[Trainable]] = {}
    for p in params:
        groups.setdefault(p.elem_bytes, []).append(p)
    return list(groups.values())
