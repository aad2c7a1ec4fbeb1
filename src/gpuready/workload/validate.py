"""The workload read against its model: what the flags ask must exist in the model and fit its shape.

Refused (InputError naming the flag): LoRA targets the model does not have, sequences longer than learned
position embeddings (gpt2: 1024). Warned (the job runs, but the figure or the run may surprise): sequences past
a RoPE model's trained context, a model_type gpuready does not model sized as a generic decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuready.errors import InputError
from gpuready.models import ModelSpec
from gpuready.workload.spec import Workload


@dataclass(frozen=True)
class CheckedWorkload:
    """A workload with its model resolved, and what a person must be told about it."""

    workload: Workload
    spec: ModelSpec
    warnings: list[str] = field(default_factory=list)  # for stderr
    assumptions: list[str] = field(default_factory=list)  # for the estimate's assumption list
    source: Any = None  # the workload file that was read (workload.formats.WorkloadFile), if any


def model_spec(w: Workload) -> ModelSpec:
    """The model of `w`, sized as `--as-family` when given."""
    from gpuready.models import resolve_model

    return resolve_model(w.model, w.as_family)


def lora_target_names(spec: ModelSpec) -> list[str]:
    """Names `--lora-targets` accepts: each block linear's name as peft matches it (last part) and in full."""
    names = [lin.name.split(".")[-1] for lin in spec.block_linears]
    names += [lin.name for lin in spec.block_linears if "." in lin.name]
    return list(dict.fromkeys(names))


def does_not_apply(spec: ModelSpec, workload: Workload, variable: str) -> str | None:
    """Why `variable` (a workload field) does not change `workload`'s memory, or None: a flag given where it has no
    effect is a warning, a sweep over it (memory/sweep.py) an error (a flat sweep would read as a finding)."""
    vision = spec.kind == "vision"
    if variable == "image_size" and not vision:
        return "image_size sizes vision models; a language model's length is seq"
    if variable == "seq" and vision:
        return "a vision model takes images; their size is image_size"
    if variable == "new_tokens" and workload.training:
        return "new_tokens are generated tokens, for --task infer"
    if variable == "new_tokens" and vision:
        return "a vision model generates no tokens"
    if variable == "lora_r" and workload.method == "full":
        return "lora_r is the adapters' rank, for --method lora or qlora"
    if variable == "grad_accum" and not workload.training:
        return "grad_accum is for training"
    if variable == "decoding" and (workload.training or vision or not workload.new_tokens):
        return "decoding is how generated tokens are chosen, for --task infer with --new-tokens"
    return None


def check_workload(w: Workload, spec: ModelSpec | None = None) -> CheckedWorkload:
    spec = spec or model_spec(w)
    warnings: list[str] = []
    assumptions: list[str] = []
    if w.method == "full" and ({"lora_targets", "lora_r"} & w.model_fields_set):
        warnings.append("--lora-targets/--lora-r: ignored with --method full (add --method lora or qlora)")
    if w.method != "full" and w.lora_targets:
        if spec.kind != "lm":
            raise InputError("--lora-targets", f"{spec.name} is a vision model; LoRA targets apply to language models")
        allowed = lora_target_names(spec)
        unknown = [t for t in w.lora_targets if t not in allowed]
        if unknown:
            raise InputError(
                "--lora-targets", f"{', '.join(unknown)} not in {spec.name}; allowed: {', '.join(allowed)}"
            )
    for name in ("image_size", "seq", "new_tokens", "lora_r", "grad_accum", "decoding"):
        why = does_not_apply(spec, w, name) if name in w.model_fields_set else None
        if why and not (name == "lora_r" and w.method == "full"):  # (that one has its own warning above)
            warnings.append(f"--{name.replace('_', '-')}: ignored: {why}")
    if spec.kind == "vision" and w.training and w.grad_ckpt:
        # neither the estimate nor the trial's probe checkpoints a vision model
        why = f"activation checkpointing is modelled for language models; {spec.name} is a vision model (drop it: the "
        raise InputError("--grad-ckpt", why + "estimate without it is an upper bound)")
    if spec.kind == "vision" and w.method != "full":
        # neither the estimate nor the trial's probe puts adapters on a vision model: both would size full
        # fine-tuning under a LoRA label
        why = f"{w.method} adapters are modelled for language models; {spec.name} is a vision model: allowed: full"
        raise InputError("--method", why)
    if spec.kind == "vision" and spec.model_type == "vit" and not spec.vision.get("transformers"):
        # torchvision's VisionTransformer asserts this when it is built (transformers' encoders interpolate instead)
        p = int(spec.vision["patch_size"])
        if w.image_size % p:
            below, above = w.image_size // p * p, (w.image_size // p + 1) * p
            near = f"{below} or {above}" if below >= p else f"{above}"
            why = f"{w.image_size} is not a multiple of {spec.name}'s patch size {p}; allowed: {near}, ..."
            raise InputError("--image-size", why)
    default_too_long = spec.learned_positions and "seq" not in w.model_fields_set and w.seq > spec.learned_positions
    if spec.kind == "lm" and default_too_long:  # the default sequence does not fit this model: take its own length
        w = w.model_copy(update={"seq": spec.learned_positions})
        assumptions.append(f"--seq {w.seq}: {spec.name}'s learned positions (the default 2048 is longer)")
    if spec.kind == "lm":
        total = w.seq + (w.new_tokens if w.task == "infer" else 0)
        limit = spec.learned_positions or spec.max_positions
        flag = "--new-tokens" if limit and w.seq <= limit < total else "--seq"
        if spec.learned_positions and total > spec.learned_positions:
            what = f"{w.seq}" if flag == "--seq" else f"{w.seq} + {w.new_tokens} new"
            raise InputError(
                flag,
                f"{what} tokens exceed {spec.name}'s {spec.learned_positions} learned positions; "
                f"allowed: at most {spec.learned_positions} tokens in all",
            )
        if spec.max_positions and total > spec.max_positions:
            warnings.append(
                f"{flag}: {total} tokens exceed {spec.name}'s trained context ({spec.max_positions} positions, "
                "max_position_embeddings); memory is sized as asked, quality past it is not promised"
            )
    if spec.assumed_from is not None:
        features = ", ".join(spec.unmodelled) if spec.unmodelled else "none found"
        if w.as_family:
            line = (
                f"model_type {spec.assumed_from!r} sized as {w.as_family} (--as-family); "
                f"config keys that layout does not model: {features}"
            )
        else:
            line = (
                f"model_type {spec.assumed_from!r} is not modelled: sized as a generic llama-style decoder "
                f"(attention q,k,v,o, gated MLP, RMSNorm); config keys not modelled: {features}"
            )
            warnings.append(
                f"model_type {spec.assumed_from!r} is not modelled; sized as a generic llama-style decoder "
                f"(not modelled: {features}); --as-family FAMILY picks the layout"
            )
        assumptions.append(line)
    return CheckedWorkload(w, spec, warnings, assumptions)
