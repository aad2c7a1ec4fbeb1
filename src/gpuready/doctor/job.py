"""Packages a job needs beyond what the image's own checks cover: the ones its options import.

`gpuready check` reads the job's options (4-bit base weights, an 8-bit optimizer, FlashAttention 2, LoRA, a model
family) and asks whether each package they need is installed here, without importing it
(`importlib.util.find_spec`), so that a missing one is a failed image check with its install command rather than
a trial that stops on an ImportError.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuready.workload import Workload


@dataclass(frozen=True)
class JobPackage:
    dist: str  # the name pip installs
    module: str  # the name `import` uses
    why: str  # the option that needs it
    fix: str  # the command that installs it


# the tool a workload file belongs to, where the file names one (workload/formats/'s format names): the job runs
# that tool; a TRL / TrainingArguments JSON may be run by transformers' Trainer alone, so it names none
TOOLS = {
    "axolotl": ("axolotl", "axolotl", "the workload is an axolotl config"),
    "llamafactory": ("llamafactory", "llamafactory", "the workload is a LLaMA-Factory config"),
}


def job_packages(
    w: Workload, vision: bool = False, torchvision_model: bool = False, framework: str | None = None
) -> list[JobPackage]:
    """The packages `w` imports (beyond torch, which the doctor checks), each once, in a stable order. `vision`:
    the model is an image model; `torchvision_model`: one of torchvision's own (resnet, vit_*); `framework`: the
    format of the workload file it came from (workload/formats/), whose tool runs it: a torchtune recipe runs on
    torchtune (its QLoRA on torchao's NF4, not bitsandbytes) rather than transformers and peft."""
    out: dict[str, JobPackage] = {}

    def need(dist: str, module: str, why: str, fix: str | None = None) -> None:
        out.setdefault(dist, JobPackage(dist, module, why, fix or f"pip install {dist}"))

    if framework == "torchtune":
        need("torchtune", "torchtune", "the workload is a torchtune recipe")
        if w.training and w.method == "qlora":
            need("torchao", "torchao", "--method qlora: torchtune's 4-bit weights are torchao's NF4")
        if w.training and w.optim == "adamw8bit":
            need("bitsandbytes", "bitsandbytes", "--optim adamw8bit")
        return list(out.values())
    if framework in TOOLS:
        need(*TOOLS[framework])
    if torchvision_model:
        need("torchvision", "torchvision", "the model is one of torchvision's")
    else:
        need("transformers", "transformers", "the model is built with transformers")
    if w.training and w.method in ("lora", "qlora"):
        need("peft", "peft", f"--method {w.method}: the adapters are peft's")
    if w.training and w.method == "qlora":
        need("bitsandbytes", "bitsandbytes", "--method qlora: 4-bit base weights")
    if w.training and w.optim == "adamw8bit":
        need("bitsandbytes", "bitsandbytes", "--optim adamw8bit")
    if w.attn == "flash" and not vision:
        need(
            "flash-attn",
            "flash_attn",
            "--attn flash: transformers' flash_attention_2",
            "pip install flash-attn --no-build-isolation (or --attn sdpa)",
        )
    return list(out.values())


def missing_job_packages(
    w: Workload,
    *,
    vision: bool = False,
    torchvision_model: bool = False,
    framework: str | None = None,
    find: Callable[[str], Any] = importlib.util.find_spec,
) -> list[JobPackage]:
    """The packages of `job_packages` that are not installed here (`find`: importlib's spec lookup, a fake in
    tests; a lookup that fails counts as missing)."""
    missing = []
    for p in job_packages(w, vision, torchvision_model, framework):
        try:
            found = find(p.module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(p)
    return missing
