"""The workload: model, task, method, shapes, precision, optimizer, parallelism.

Field names are the docs/cli.md flags with dashes turned into underscores; a TOML workload file uses the
same names (either spelling). Validation errors become one-line `InputError`s naming the flag.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from gpuready.errors import InputError

if TYPE_CHECKING:
    from pydantic import BaseModel

Task = Literal["train", "infer"]
Method = Literal["full", "lora", "qlora"]
Precision = Literal["bf16", "fp16", "fp32", "mixed"]
Optim = Literal["adamw", "adamw8bit", "sgd", "adafactor"]
Attn = Literal["sdpa", "eager", "flash"]
Decoding = Literal["greedy", "sample"]
# --decoding sample: generate(do_sample=True, ...) with these, the warpers a sampling generation_config names (Llama
# 3.1's: temperature 0.6, top_p 0.9, with GenerationConfig's default top_k 50). Memory depends on which warpers run
# (and top_k's k), not on the values.
SAMPLING: dict[str, float | int] = {"temperature": 0.6, "top_k": 50, "top_p": 0.9}
LoraDtype = Literal["fp32", "bf16"]
Shard = Literal["none", "ddp", "fsdp", "zero1", "zero2", "zero3"]

# Every field, in order, with its default ("model" has none) and what it allows: the one statement of the rules,
# read by Workload's own check and by the pydantic model that words the errors (_pydantic_model)
_REQUIRED = object()
DEFAULTS: dict[str, Any] = {
    "model": _REQUIRED,
    "task": "train",
    "method": "full",
    "batch": 1,
    "seq": 2048,
    "new_tokens": 0,
    "decoding": "greedy",  # generate()'s: greedy, or sampling with temperature, top-k and top-p
    "image_size": 224,
    "precision": "bf16",
    "autocast": False,  # the HF Trainer's bf16/fp16 switch over 16-bit weights (mixed already runs under autocast)
    "optim": "adamw",
    "grad_ckpt": False,
    "grad_accum": 1,
    "lora_r": 16,
    "lora_targets": None,
    "lora_dtype": "fp32",  # peft's adapters: fp32 (autocast_adapter_dtype), or cast to bf16 (TRL, for QLoRA)
    "kbit_prep": False,  # peft's prepare_model_for_kbit_training before the adapters (QLoRA scripts)
    "attn": "sdpa",
    "gpus": 1,
    "shard": "none",
    "as_family": None,  # size the model as this model_type (an unmodelled config, or to compare)
}
CHOICES: dict[str, tuple[str, ...]] = {
    "task": get_args(Task),
    "method": get_args(Method),
    "precision": get_args(Precision),
    "optim": get_args(Optim),
    "attn": get_args(Attn),
    "decoding": get_args(Decoding),
    "lora_dtype": get_args(LoraDtype),
    "shard": get_args(Shard),
}
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "batch": (1, 1_000_000),
    "seq": (1, 10_000_000),
    "new_tokens": (0, 10_000_000),
    "image_size": (16, 16384),
    "grad_accum": (1, 1_000_000),
    "lora_r": (1, 65536),
    "gpus": (1, 4096),
}
FIELDS: tuple[str, ...] = tuple(DEFAULTS)
_BOOLS = ("grad_ckpt", "autocast", "kbit_prep")


def _split_targets(value: Any) -> Any:
    """--lora-targets as given: "q_proj, v_proj" or a list becomes a tuple ("" and None: none given)."""
    if isinstance(value, str):
        parts = tuple(p.strip() for p in value.split(",") if p.strip())
        return parts or None
    if isinstance(value, list):
        return tuple(value)
    return value


def _known_family(value: str | None) -> str | None:
    from gpuready.models.spec import LM_TYPES

    if value is not None and value not in LM_TYPES:
        raise ValueError(f"got {value!r}; allowed: {', '.join(LM_TYPES)}")
    return value


def _consistency_error(values: dict[str, Any]) -> str | None:
    if values["task"] == "infer" and values["method"] != "full":
        return "method: LoRA/QLoRA are training methods; use --task train or drop --method"
    if values["autocast"] and values["precision"] not in ("bf16", "fp16"):
        return (
            "autocast: the switch for 16-bit weights (--precision bf16 or fp16); fp32 weights under autocast are "
            "--precision mixed"
        )
    if values["autocast"] and values["task"] != "train":
        return "autocast: modelled for training (the Trainer's bf16/fp16 switch); drop it for --task infer"
    if values["lora_dtype"] != "fp32" and values["method"] == "full":
        return "lora-dtype: the adapters' dtype, for --method lora or qlora"
    if values["lora_dtype"] == "bf16" and values["precision"] != "bf16":
        return "lora-dtype: bf16 adapters are modelled over bf16 weights (--precision bf16)"
    if values["kbit_prep"] and values["method"] != "qlora":
        return "kbit-prep: peft's prepare_model_for_kbit_training, for --method qlora"
    if values["kbit_prep"] and not values["autocast"]:
        return "kbit-prep: modelled under the Trainer's autocast (add --autocast)"
    if values["kbit_prep"] and values["lora_dtype"] != "fp32":
        return "kbit-prep: modelled with peft's fp32 adapters (--lora-dtype fp32)"
    if values["method"] == "qlora" and values["precision"] == "mixed":
        # mixed = fp32 weights under autocast; QLoRA's base is 4-bit, computed in bnb_4bit_compute_dtype
        return (
            "precision: QLoRA's base weights are 4-bit, computed in bf16, fp16 or fp32; "
            "mixed (fp32 weights) does not apply"
        )
    if values["attn"] == "flash" and values["precision"] == "fp32":
        # flash-attn (transformers' flash_attention_2) and SDPA's flash kernel take fp16/bf16 only
        return "attn: flash attention runs in bf16 or fp16; with --precision fp32 use sdpa or eager"
    if values["shard"] != "none" and values["gpus"] < 2:
        return f"shard: --shard {values['shard']} needs --gpus 2 or more"
    return None


def _plain(fields: dict[str, Any]) -> dict[str, Any] | None:
    """The field values when every given one is already what the rules give back unchanged (a str in its choices,
    an int within its bounds, a bool, ...), else None: then the pydantic model validates (and coerces, or words
    the error). Checking the common case here keeps pydantic out of a CLI run (docs/speed.md)."""
    values = dict(DEFAULTS)
    for name, value in fields.items():
        if name not in values:
            return None
        if name in INT_BOUNDS:
            lo, hi = INT_BOUNDS[name]
            if type(value) is not int or not lo <= value <= hi:
                return None
        elif name in CHOICES:
            if type(value) is not str or value not in CHOICES[name]:
                return None
        elif name == "model":
            if type(value) is not str or not value:
                return None
        elif name in _BOOLS:
            if type(value) is not bool:
                return None
        elif name == "lora_targets":
            value = _split_targets(value)
            if value is not None and (type(value) is not tuple or any(type(t) is not str for t in value)):
                return None
        elif name == "as_family":
            if value is not None and type(value) is not str:
                return None
            try:
                _known_family(value)
            except ValueError:
                return None
        values[name] = value
    if values["model"] is _REQUIRED or _consistency_error(values):
        return None
    return values


class Workload:
    """One job, as docs/cli.md defines it. Immutable; use `model_copy(update=...)` for variants.

    The rules are DEFAULTS, CHOICES and INT_BOUNDS above. A plain class with pydantic's interface for what gpuready
    uses (`model_copy`, `model_dump`, `model_fields_set`, equality and hashing by value): values given as the
    rules return them are taken as they are, anything else (a number as a string, a value out of range) goes
    through the pydantic model built from the same rules, which coerces as before or raises its ValidationError.
    """

    __slots__ = ("_fields_set", "_hash", "_key", *FIELDS)

    model: str
    task: Task
    method: Method
    batch: int
    seq: int
    new_tokens: int
    decoding: Decoding
    image_size: int
    precision: Precision
    autocast: bool
    optim: Optim
    grad_ckpt: bool
    grad_accum: int
    lora_r: int
    lora_targets: tuple[str, ...] | None
    lora_dtype: LoraDtype
    kbit_prep: bool
    attn: Attn
    gpus: int
    shard: Shard
    as_family: str | None
    _fields_set: set[str]
    _key: tuple[Any, ...]  # the values in FIELDS order: equality, hashing and copies read this
    _hash: int

    def __init__(self, **fields: Any) -> None:
        values = _plain(fields)
        if values is None:
            checked = _pydantic_model()(**fields)  # raises pydantic's ValidationError, as before
            values = {name: getattr(checked, name) for name in FIELDS}
            fields_set = set(checked.model_fields_set)
        else:
            fields_set = set(fields)
        self._set(values, fields_set)

    def _set(self, values: dict[str, Any], fields_set: set[str]) -> None:
        self._fill(tuple(values[name] for name in FIELDS), fields_set)

    def _fill(self, key: tuple[Any, ...], fields_set: set[str]) -> None:
        for slot, value in zip(_SLOTS, (*key, key, hash(key), fields_set), strict=True):
            slot.__set__(self, value)  # the slot itself: __setattr__ refuses

    @classmethod
    def _make(cls, values: dict[str, Any], fields_set: set[str]) -> Workload:
        w = cls.__new__(cls)
        w._set(values, fields_set)
        return w

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Workload is immutable: use model_copy(update={{{name!r}: ...}})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Workload is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Workload)
        return self._hash == other._hash and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Workload({', '.join(f'{name}={getattr(self, name)!r}' for name in FIELDS)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Workload._make, (dict(zip(FIELDS, self._key, strict=True)), set(self._fields_set)))

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(zip(FIELDS, self._key, strict=True))

    @property
    def model_fields_set(self) -> set[str]:
        """The fields given when it was made (and by model_copy's updates), as pydantic keeps them."""
        return set(self._fields_set)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Workload:
        """A copy with `update` applied as given, not validated (as pydantic's model_copy)."""
        key = list(self._key)
        for name, value in (update or {}).items():
            index = _INDEX.get(name)
            if index is None:
                raise ValueError(f"unknown workload field: {name}")
            key[index] = value
        w = Workload.__new__(Workload)
        w._fill(tuple(key), self._fields_set | update.keys() if update else set(self._fields_set))
        return w

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]:
        """The fields as a dict; mode="json": tuples as lists."""
        out = dict(zip(FIELDS, self._key, strict=True))
        if mode == "json" and out["lora_targets"] is not None:
            out["lora_targets"] = list(out["lora_targets"])
        return out

    @property
    def training(self) -> bool:
        return self.task == "train"


# the slots' descriptors, in the order _set fills them: the fields, then the key, its hash and the fields given
_SLOTS = [Workload.__dict__[name] for name in (*FIELDS, "_key", "_hash", "_fields_set")]
_INDEX = {name: i for i, name in enumerate(FIELDS)}

_MODEL: list[type[BaseModel]] = []


def _pydantic_model() -> type[BaseModel]:
    """The pydantic model of the rules above, built on first use (values Workload does not take as they are)."""
    if _MODEL:
        return _MODEL[0]
    from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

    specs: dict[str, Any] = {}
    for name, default in DEFAULTS.items():
        if name == "model":
            specs[name] = (str, Field(min_length=1))
        elif name in INT_BOUNDS:
            lo, hi = INT_BOUNDS[name]
            specs[name] = (int, Field(default=default, ge=lo, le=hi))
        elif name in CHOICES:
            specs[name] = (Literal[CHOICES[name]], default)
        elif name in _BOOLS:
            specs[name] = (bool, default)
        elif name == "lora_targets":
            specs[name] = (tuple[str, ...] | None, default)
        else:
            specs[name] = (str | None, default)

    def consistent(self: Any) -> Any:
        error = _consistency_error({name: getattr(self, name) for name in FIELDS})
        if error:
            raise ValueError(error)
        return self

    validators: dict[str, Any] = {
        "_split_targets": field_validator("lora_targets", mode="before")(lambda cls, v: _split_targets(v)),
        "_known_family": field_validator("as_family", mode="after")(lambda cls, v: _known_family(v)),
        "_consistent": model_validator(mode="after")(consistent),
    }
    model: type[BaseModel] = create_model(
        "Workload", __config__=ConfigDict(frozen=True, extra="forbid"), __validators__=validators, **specs
    )
    _MODEL.append(model)
    return model


def _range_hint(name: str) -> str | None:
    """`an integer from 1 to 1,000,000`, from the field's own bounds."""
    if name not in INT_BOUNDS:
        return None
    lo, hi = INT_BOUNDS[name]
    return f"an integer from {lo:,} to {hi:,}"


_ALLOWED_HINT = {
    "grad_ckpt": "true or false",
    "autocast": "true or false",
    "kbit_prep": "true or false",
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
    values = _plain(clean)
    if values is not None:  # the common case: no pydantic (Workload's own check)
        return Workload._make(values, set(clean))
    from pydantic import ValidationError

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
    import tomllib  # only when a file is read

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


_BOOL_FLAGS = set(_BOOLS)


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
        value: Any = words[i + 1]
        if name in INT_BOUNDS and value.isdigit():
            value = int(value)  # as the CLI's parser gives it: the plain path, no pydantic (a GPU machine may lack it)
        fields[name] = value
        i += 2
    return make_workload(**fields)


def describe(w: Workload) -> str:
    """One line a person reads: `llama-3.1-8b · train · lora r=16 · batch 1 · seq 2048 · bf16 · adamw`."""
    parts = [w.model, w.task]
    if w.task == "train":
        lora = f"{w.method} r={w.lora_r}" + (f" ({w.lora_dtype} adapters)" if w.lora_dtype != "fp32" else "")
        lora += " (prepare_model_for_kbit_training)" if w.kbit_prep else ""
        parts.append(w.method if w.method == "full" else lora)
    # image models take --image-size, not --seq (torchvision presets: resnet*, vit_*)
    from gpuready.models.presets import find_preset

    preset = find_preset(w.model)
    vision = preset is not None and preset.config.get("model_type") in ("resnet", "vit")
    parts += [f"batch {w.batch}", f"{w.image_size} px" if vision else f"seq {w.seq}"]
    if w.task == "infer" and w.new_tokens:
        parts.append(f"+{w.new_tokens} new tokens" + (" sampled" if w.decoding == "sample" else ""))
    parts.append(f"{w.precision} under autocast" if w.autocast else w.precision)
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
