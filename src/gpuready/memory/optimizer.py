"""Optimizer states and the step's temporaries, as PyTorch's and bitsandbytes' optimizers allocate them."""

from __future__ import annotations

from dataclasses import dataclass

from gpuready.memory.program import Program

# bitsandbytes 8-bit blockwise optimizers: one byte per state element plus an fp32 absmax per block of 2048
# (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"; bnb's min_8bit_size=4096 keeps
# smaller tensors in 32 bit).
BNB_BLOCK = 2048
BNB_MIN_8BIT = 4096


@dataclass(frozen=True)
class Trainable:
    numel: int
    elem_bytes: int

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
            for p in params:
                for _ in range(2):
                    if p.numel >= BNB_MIN_8BIT:
                        handles.append(prog.alloc("optimizer_states", p.numel + 4 * -(-p.numel // BNB_BLOCK)))
                    else:
                        handles.append(prog.alloc("optimizer_states", 4 * p.numel))
    elif optim == "adafactor":
        # transformers.optimization.Adafactor (beta1=None): factored second moment (a row and a column vector
        # in fp32) for matrices, full fp32 for vectors; each step works on one parameter at a time in fp32
        # (grad.float(), p.float(), update = grad**2 + eps): about three fp32 copies of the largest tensor.
        if first:
            for p in params:
                handles.append(prog.alloc("optimizer_states", 4 * _factored(p.numel)))
        largest = max((p.numel for p in params), default=0)
        prog.transient("optimizer_temporaries", 4 * largest, 4 * largest, 4 * largest)
    return handles


def _factored(numel: int) -> int:
    """Elements of Adafactor's factored second moment for a square-ish matrix of `numel` elements."""
    if numel < 4096:
        return numel
    side = int(numel**0.5)
    return 2 * side


def _dtype_groups(params: list[Trainable]) -> list[list[Trainable]]:
    groups: dict[int, list[Trainable]] = {}
    for p in params:
        groups.setdefault(p.elem_bytes, []).append(p)
    return list(groups.values())
