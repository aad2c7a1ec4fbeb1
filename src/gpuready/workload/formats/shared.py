"""Mappings several tools share: optimizer and attention names, DeepSpeed ZeRO and FSDP, sample packing and the
bf16/fp16 switches."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gpuready.workload.formats.reader import _as_bool, _Reader
from gpuready.workload.formats.result import Mapped

# optimizer names: transformers' OptimizerNames values plus axolotl's and torchtune's spellings
_OPTIMS = {
    "adamw": (
        "adamw_torch",
        "adamw_torch_fused",
        "adamw_hf",
        "adamw_apex_fused",
        "adamw",
        "paged_adamw_32bit",
        "adamw_anyprecision",
        "torch.optim.adamw",
        "torch.optim.adam",
    ),
    "adamw8bit": (
        "adamw_bnb_8bit",
        "adamw_8bit",
        "paged_adamw_8bit",
        "adamw_torch_8bit",
        "bitsandbytes.optim.pagedadamw8bit",
        "bitsandbytes.optim.adamw8bit",
        "torchao.optim.adamw8bit",
    ),
    "adafactor": ("adafactor", "transformers.optimization.adafactor"),
    "sgd": ("sgd", "torch.optim.sgd"),
}
_OPTIM_NOTES = {
    "adamw_torch_fused": "fused AdamW has no foreach temporaries; sized as foreach AdamW (slightly over)",
    "paged_adamw_32bit": "paged AdamW may page states to host memory under pressure; sized as resident",
    "paged_adamw_8bit": "paged 8-bit AdamW may page states to host memory under pressure; sized as resident",
    "adamw_torch_8bit": "torchao's 8-bit AdamW sized as bitsandbytes' (1 B/state + block scales)",
}


def _map_optim(r: _Reader, key: str, name: Any) -> None:
    low = str(name).strip().lower()
    for ours, names in _OPTIMS.items():
        if low in names:
            r.set("optim", ours, key, name)
            if low in _OPTIM_NOTES:
                r.note(f"{key}: {_OPTIM_NOTES[low]}")
            return
    r.used.add(key)
    r.problem("optim", f"{key}: {name!r} is not modelled; gpuready sizes adamw, adamw8bit, sgd and adafactor")


def _map_attn(r: _Reader, key: str, value: Any) -> None:
    low = str(value).strip().lower()
    table = {"fa2": "flash", "flash_attention_2": "flash", "sdpa": "sdpa", "eager": "eager", "auto": "sdpa"}
    if low in table:
        r.set("attn", table[low], key, value)
        if low == "auto":
            r.note(f"{key}: auto sized as PyTorch SDPA")
    else:
        r.used.add(key)
        r.note(f"{key}: {value!r} sized as PyTorch SDPA")


def _zero_stage(r: _Reader, key: str, value: Any) -> None:
    """DeepSpeed: a path to a JSON config (read when it exists, relative to the workload file) or a table."""
    stage: int | None = None
    offload = False
    if isinstance(value, dict):
        zo = value.get("zero_optimization") or {}
        stage = zo.get("stage") if isinstance(zo, dict) else None
        offload = isinstance(zo, dict) and any(k.startswith("offload") for k in zo)
    else:
        where = Path(str(value))
        if not where.is_absolute():
            where = Path(r.out.path).parent / where
        try:
            cfg = json.loads(where.read_text(encoding="utf-8"))
            zo = cfg.get("zero_optimization") or {}
            raw = zo.get("stage") if isinstance(zo, dict) else None
            stage = int(raw) if raw is not None else None
            offload = isinstance(zo, dict) and any(k.startswith("offload") for k in zo)
        except (OSError, ValueError, AttributeError, TypeError):
            m = re.search(r"(?:zero|z)_?([0-3])", where.name.lower())
            stage = int(m.group(1)) if m else None
            if stage is not None:
                r.note(f"{key}: {value} not readable here; ZeRO stage {stage} taken from its name")
    r.used.update(k for k in r.flat if k == key or k.startswith(key + "."))
    if stage is None or stage == 0:
        r.note(f"{key}: DeepSpeed without ZeRO sharding sized as DDP")
        r.set("shard", "ddp", key, value)
        r.problem("gpus", f"{key}: the file runs on several GPUs; say how many with --gpus N")
        return
    r.out.mapped.append(Mapped(key, value, "shard", f"zero{stage}"))
    r.problem(
        "shard",
        f"{key}: DeepSpeed ZeRO-{stage}{' with offload' if offload else ''} is not modelled; "
        "size the job with --shard fsdp (FSDP2) or --shard ddp instead",
    )


def _fsdp(r: _Reader, key: str, value: Any) -> None:
    r.set("shard", "fsdp", key, value)
    r.problem("gpus", f"{key}: FSDP shards over several GPUs; say how many with --gpus N")
    for k in ("fsdp_config.offload_params", "fsdp_config.fsdp_offload_params", "fsdp_config.cpu_offload"):
        r.not_modelled[k] = "parameters offloaded to the CPU: less GPU memory than sized"
    r.note(f"{key}: sized as PyTorch FSDP2 (fully_shard), the whole model built per GPU first")


def _packing(r: _Reader, key: str, seq_key: str) -> None:
    v = r.get(key)
    if v is None:
        r.note(f"{key} not set: batches padded to their longest sequence; sized at {seq_key}, the upper bound")
        return
    r.used.add(key)
    r.out.mapped.append(Mapped(key, v, "", "rows packed to full length" if _as_bool(v) else "seq is the upper bound"))
    if not _as_bool(v):
        r.note(f"{key}: false: batches padded to their longest sequence; sized at {seq_key}, the upper bound")


def _precision_16(r: _Reader, bf16_means: str) -> None:
    """bf16/fp16 switches: bf16_means is what `bf16: true` does to the weights in this tool."""
    bf16, fp16 = r.peek("bf16"), r.peek("fp16")
    if bf16 is not None and _as_bool(bf16):
        r.set("precision", bf16_means, "bf16", bf16)
        if bf16_means == "bf16":  # the Trainer's switch: autocast over the bf16 weights (mixed implies it)
            r.out.fields["autocast"] = True
        if str(bf16).lower() == "auto":
            r.note("bf16: auto sized as bf16 (axolotl picks bf16 where the GPU has it)")
    elif fp16 is not None and _as_bool(fp16):
        r.set("precision", "fp16" if bf16_means == "bf16" else "mixed", "fp16", fp16)
        if bf16_means == "bf16":
            r.out.fields["autocast"] = True
        if bf16_means != "bf16":
            r.note("fp16: fp32 weights under fp16 autocast, sized as mixed precision")
    elif bf16 is not None or fp16 is not None:
        r.set("precision", "fp32", "bf16" if bf16 is not None else "fp16", False)
    r.also("bf16", "off")
    r.also("fp16", "off")
    if r.has("tf32"):
        r.used.add("tf32")
        r.out.mapped.append(Mapped("tf32", r.peek("tf32"), "", "matmul mode, no memory effect"))
