"""Bytes per element for each part of a job, from the workload's precision (docs/cli.md, --precision)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuready.workload import Workload


@dataclass(frozen=True)
class Dtypes:
    param: int  # weights as held (and gradients, and PyTorch's optimizer states: same dtype as the parameter)
    act: int  # outputs of matmuls / convs (autocast runs them in bf16 under `mixed`)
    resid: int  # the residual stream and element-wise ops outside autocast's lists
    autocast: bool  # forward under torch.autocast(bfloat16) with fp32 weights
    # forward under torch.autocast over 16-bit weights (--autocast: the HF Trainer's bf16/fp16 switch): the matmuls
    # and the residual stream are as without it; what changes is what runs in fp32 around 16-bit weights (peft's
    # fp32 adapters, whose inputs autocast casts back to 16 bits)
    autocast16: bool = False
    lora16: bool = False  # peft's adapters cast to 16 bits (--lora-dtype bf16): no fp32 copies, 16-bit gradients


def dtypes_for(w: Workload) -> Dtypes:
    if w.precision == "mixed":
        return Dtypes(param=4, act=2, resid=4, autocast=True)
    if w.precision == "fp32":
        return Dtypes(param=4, act=4, resid=4, autocast=False)
    return Dtypes(param=2, act=2, resid=2, autocast=False, autocast16=w.autocast, lora16=w.lora_dtype == "bf16")
