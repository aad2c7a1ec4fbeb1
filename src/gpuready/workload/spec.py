"""The workload: model, task, method, shapes, precision, optimizer, parallelism.

Field names are the docs/cli.md flags with dashes turned into underscores; a TOML workload file uses the
same names (either spelling). Validation errors become one-line `InputError`s naming the flag.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuready.errors import InputError

Task = Literal["train", "infer"]
Method = Literal["full", "lora", "qlora"]
Precision = Literal["bf16", "fp16", "fp32", "mixed"]
Optim = Literal["adamw", "adamw8bit", "sgd", "adafactor"]
Attn = Literal["sdpa", "eager", "flash"]
Shard = Literal["none", "ddp", "fsdp", "zero1", "zero2", "zero3"]


class Workload(BaseModel):
    """One job, as docs/cli.md defines it. Immutable; use `model_copy(update=...)` for variants."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1)
    task: Task = "train"
    method: Method = "full"
    batch: int = Field(default=1, ge=1, le=1_000_000)
    seq: int = Field(default=2048, ge=1, le=10_000_000)
    new_tokens: int = Field(default=0, ge=0, le=10_000_000)
    image_size: int = Field(default=224, ge=16, le=16384)
    precision: Precision = "bf16"
    optim: Optim = "adamw"
    grad_ckpt: bool = False
    grad_accum: int = Field(default=1, ge=1, le=1_000_000)
    lora_r: int = Field(default=16, ge=1, le=65536)
    lora_targets: tuple[str, ...] | None = None
    attn: Attn = "sdpa"
    gpus: int = Field(default=1, ge=1, le=4096)
    shard: Shard = "none"
    as_family: str | None = None  # size the model as this model_type (an unmodelled config, or to compare)

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _split_targets(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = tuple(p.strip() for p in value.split(",") if p.strip())
            return parts or None
        if isinstance(value, list):
            return tuple(value)
        return value

    @field_validator("as_family", mode="after")
    @classmethod
    def _known_family(cls, value: str | None) -> str | None:
        from gpuready.models.spec import LM_TYPES

        if value is not None and value not in LM_TYPES:
            raise ValueError(f"got {value!r}; allowed: {', '.join(LM_TYPES)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Workload:
        if self.task == "infer" and self.method != "full":
            raise ValueError("method: LoRA/QLoRA are training methods; use --task train or drop --method")
        if self.shard != "none" and self.gpus < 2:
            raise ValueError(f"shard: --shard {self.shard} needs --gpus 2 or more")
        return self

    @property
    def training(self) -> bool:
        return self.task == "train"


FIELDS: tuple[str, ...] = tuple(Workload.model_fields)


def _range_hint(name: str) -> str | None:
    """`an integer from 1 to 1,000,000`, from the field's own bounds."""
    lo = hi = None
    for meta in Workload.model_fields[name].metadata:
        lo = getattr(meta, "ge", lo)
        hi = getattr(meta, "le", hi)
    if lo is None or hi is None:
        return None
    return f"an integer from {lo:,} to {hi:,}"


_ALLOWED_HINT = {
    "grad_ckpt": "true or false",
    "model": "a preset name, hub id, config.json or model folder",
    "lora_targets": "comma-separated module names, e.g. q_proj,v_proj",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def make_workload(**fields: Any) -> Workload:
    """Build a Workload, turning pydantic's errors into one `InputError` naming the flag and what is allowed."""
    clean = {k.replace("-", "_"): v for k, v in fields.items() if v is not None}
    unknown = sorted(set(clean) - set(FIELDS))
    if unknown:
        raise InputError(unknown[0], f"unknown workload field; allowed: {', '.join(FIELDS)}")
    try:
        return Workload(**clean)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        name = loc[0] if loc else ""
        if not name:
            # a model-level rule; its message starts with the field name
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            field, _, rest = msg.partition(": ")
            raise InputError(_flag(field), rest or msg) from None
        allowed = _ALLOWED_HINT.get(name) or _range_hint(name)
        ctx = err.get("ctx") or {}
        if "expected" in ctx:
            allowed = f"one of {ctx['expected']}"
        got = err.get("input")
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        if msg.startswith("got "):  # a field validator's own message says it all
            raise InputError(_flag(name), msg) from None
        raise InputError(_flag(name), f"got {got!r}; allowed: {allowed or msg}") from None


def load_workload_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML workload file (same field names as the flags; `[workload]` table optional)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise InputError("--workload", f"{p}: no such file") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError("--workload", f"{p}: not readable TOML ({exc})") from None
    table = data.get("workload", data)
    if not isinstance(table, dict):
        raise InputError("--workload", f"{p}: [workload] must be a table")
    return {str(k).replace("-", "_"): v for k, v in table.items()}


_BOOL_FLAGS = {"grad_ckpt"}


def workload_from_args(args: list[str] | str) -> Workload:
    """Parse docs/cli.md's workload arguments (`MODEL --flag value ...`), as the calibration files write jobs."""
    import shlex

    words = shlex.split(args) if isinstance(args, str) else list(args)
    fields: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            if "model" in fields:
                raise InputError("MODEL", f"unexpected extra argument {word!r}")
            fields["model"] = word
            i += 1
            continue
        name = word[2:].replace("-", "_")
        if name in _BOOL_FLAGS:
            fields[name] = True
            i += 1
            continue
        if name.startswith("no_") and name[3:] in _BOOL_FLAGS:
            fields[name[3:]] = False
            i += 1
            continue
        if i + 1 >= len(words):
            raise InputError(word, "needs a value")
        fields[name] = words[i + 1]
        i += 2
    return make_workload(**fields)


def describe(w: Workload) -> str:
    """One line a person reads: `llama-3.1-8b · train · lora r=16 · batch 1 · seq 2048 · bf16 · adamw`."""
    parts = [w.model, w.task]
    if w.task == "train":
        parts.append(w.method if w.method == "full" else f"{w.method} r={w.lora_r}")
    # image models take --image-size, not --seq (torchvision presets: resnet*, vit_*)
    from gpuready.models.presets import find_preset

    preset = find_preset(w.model)
    vision = preset is not None and preset.config.get("model_type") in ("resnet", "vit")
    parts += [f"batch {w.batch}", f"{w.image_size} px" if vision else f"seq {w.seq}"]
    if w.task == "infer" and w.new_tokens:
        parts.append(f"+{w.new_tokens} new tokens")
    parts.append(w.precision)
    if w.task == "train":
        parts.append(w.optim)
        if w.grad_ckpt:
            parts.append("grad-ckpt")
        if w.grad_accum > 1:
            parts.append(f"grad-accum {w.grad_accum}")
    if w.gpus > 1:
        parts.append(f"{w.gpus} GPUs {w.shard}")
    if w.as_family:
        parts.append(f"as {w.as_family}")
    return " · ".join(parts)
