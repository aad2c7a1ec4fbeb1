"""Workload files people already have: axolotl, LLaMA-Factory and torchtune YAML, TRL/TrainingArguments JSON.

`read_workload_file` tells the format from the content (not the name), maps what the file says onto the
workload's fields and lists every key it did not use, with why: a key that changes memory but is not modelled
is a warning, never silently dropped. Our own TOML is read as before. PyYAML is imported only for YAML files.

Field names and meanings, per tool's documentation (read 2026-11-30):
- axolotl: https://docs.axolotl.ai/docs/config-reference.html
- LLaMA-Factory: https://llamafactory.readthedocs.io/en/latest/advanced/arguments.html and
  https://github.com/hiyouga/LLaMA-Factory/blob/main/examples/README.md
- torchtune: https://docs.pytorch.org/torchtune/stable/deep_dives/configs.html and the shipped recipes, e.g.
  https://github.com/pytorch/torchtune/blob/main/recipes/configs/llama3/8B_lora_single_device.yaml
- transformers TrainingArguments: https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments
  (optimizer names: `transformers.training_args.OptimizerNames`); TRL SFTConfig / ModelConfig:
  https://huggingface.co/docs/trl/sft_trainer and https://huggingface.co/docs/trl/clis
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpuready.errors import InputError

FORMAT_NAMES = {
    "gpuready": "gpuready TOML",
    "axolotl": "axolotl YAML",
    "llamafactory": "LLaMA-Factory YAML",
    "torchtune": "torchtune recipe YAML",
    "trl": "TRL / TrainingArguments",
}

# why a key was not used
NO_EFFECT = "no effect on memory"
NOT_MODELLED = "changes memory, not modelled"
NOT_READ = "not read by gpuready"
EMPTY = "empty"


@dataclass(frozen=True)
class Mapped:
    key: str  # the file's key (dotted for nested tables)
    value: Any  # the file's value
    field: str  # the workload field it set
    to: Any  # the value it set


@dataclass(frozen=True)
class Ignored:
    key: str
    value: Any
    reason: str
    detail: str = ""


@dataclass
class WorkloadFile:
    """What a workload file said, in workload fields, and what of it was not used."""

    path: str
    format: str
    fields: dict[str, Any] = field(default_factory=dict)
    mapped: list[Mapped] = field(default_factory=list)
    ignored: list[Ignored] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # assumptions made while mapping
    problems: dict[str, str] = field(default_factory=dict)  # workload field -> why the file's value can't be sized

    @property
    def label(self) -> str:
        return FORMAT_NAMES[self.format]

    @property
    def warnings(self) -> list[Ignored]:
        return [i for i in self.ignored if i.reason == NOT_MODELLED]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "format_name": self.label,
            "fields": self.fields,
            "mapped": [{"key": m.key, "value": m.value, "field": m.field, "to": m.to} for m in self.mapped],
            "ignored": [
                {"key": i.key, "value": i.value, "reason": i.reason} | ({"detail": i.detail} if i.detail else {})
                for i in self.ignored
            ],
            "notes": self.notes,
        }


# ---------------------------------------------------------------------------------------------------------------
# reading and detecting


def read_workload_file(path: str | Path) -> WorkloadFile:
    """Read a workload file of any supported format; the format is told from the content (TOML is ours)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("--workload", f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("--workload", f"{p}: not readable ({exc})") from None
    data, kind, why = _parse(text, p)
    if data is None:
        raise InputError("--workload", f"{p}: not readable TOML ({why})")
    # our TOML keeps its own rules (unknown fields are named by make_workload); JSON and YAML are the tools'
    fmt = "gpuready" if kind == "toml" else detect_format(data)
    if fmt is None:
        raise InputError(
            "--workload",
            f"{p}: not a format gpuready reads; it reads its TOML, axolotl, LLaMA-Factory and torchtune YAML, "
            "and TRL/TrainingArguments JSON",
        )
    if fmt == "gpuready":
        table = data.get("workload", data)
        if not isinstance(table, dict):
            raise InputError("--workload", f"{p}: [workload] must be a table")
        fields = {str(k).replace("-", "_"): v for k, v in table.items()}
        return WorkloadFile(str(p), fmt, fields=fields)
    reader = _Reader(str(p), fmt, data)
    _TRANSLATORS[fmt](reader)
    return reader.finish()


def _parse(text: str, p: Path) -> tuple[dict[str, Any] | None, str, str]:
    """(table, "toml" | "json" | "yaml", "") or (None, "", why): TOML, else JSON, else YAML (imported only here)."""
    try:
        return tomllib.loads(text), "toml", ""
    except tomllib.TOMLDecodeError as exc:
        toml_error = str(exc)
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError("--workload", f"{p}: not readable JSON ({exc})") from None
        if not isinstance(data, dict):
            raise InputError("--workload", f"{p}: the JSON must be an object")
        return data, "json", ""
    if p.suffix.lower() == ".toml":
        return None, "", toml_error
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        raise InputError("--workload", f"{p}: reading YAML needs PyYAML: pip install pyyaml") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        msg = " ".join(str(exc).split())
        raise InputError("--workload", f"{p}: not readable TOML or YAML ({msg})") from None
    if not isinstance(loaded, dict):
        return None, "", toml_error
    return {str(k): v for k, v in loaded.items()}, "yaml", ""


_AXOLOTL_KEYS = {"base_model", "micro_batch_size", "sequence_len", "sample_packing", "adapter", "lora_target_linear"}
_LLAMAFACTORY_KEYS = {"finetuning_type", "cutoff_len", "template", "stage", "lora_target", "quantization_bit"}
_TRAINER_KEYS = {
    "per_device_train_batch_size",
    "output_dir",
    "optim",
    "max_seq_length",
    "max_length",
    "use_peft",
    "dataset_text_field",
    "gradient_checkpointing",
}


def detect_format(data: dict[str, Any]) -> str | None:
    """Which tool wrote this table: a torchtune recipe has `_component_` tables, axolotl its own names, ..."""
    from gpuready.workload.spec import FIELDS

    keys = {str(k).replace("-", "_") for k in data}
    if any(isinstance(v, dict) and "_component_" in v for v in data.values()):
        return "torchtune"
    if keys & _AXOLOTL_KEYS:
        return "axolotl"
    if keys & _LLAMAFACTORY_KEYS:
        return "llamafactory"
    if keys & _TRAINER_KEYS:
        return "trl"
    table = data.get("workload", data)
    if isinstance(table, dict) and {str(k).replace("-", "_") for k in table} <= set(FIELDS):
        return "gpuready"
    return None


# ---------------------------------------------------------------------------------------------------------------
# the mapping machinery


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key != "deepspeed":  # an inline DeepSpeed config stays one value
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _empty(v: Any) -> bool:
    return v is None or (isinstance(v, str | list | dict) and len(v) == 0)


class _Reader:
    """Keys are taken as they are used; whatever is left at the end is listed as ignored, with a reason."""

    def __init__(self, path: str, fmt: str, data: dict[str, Any]) -> None:
        self.out = WorkloadFile(path, fmt)
        self.flat = _flatten(data)
        self.used: set[str] = set()
        self.not_modelled: dict[str, str] = {}
        self.no_effect: set[str] = set()

    def known(self, no_effect: set[str] | frozenset[str], not_modelled: dict[str, str]) -> None:
        """The tool's keys gpuready does not use: those with no effect on memory, and those that change memory but
        are not modelled (an empty reason: no effect after all)."""
        self.no_effect |= no_effect
        self.not_modelled.update({k: v for k, v in not_modelled.items() if v})
        self.no_effect |= {k for k, v in not_modelled.items() if not v}

    def has(self, key: str) -> bool:
        return key in self.flat and not _empty(self.flat[key])

    def get(self, key: str, default: Any = None) -> Any:
        """The value (None when absent or empty); the key counts as used."""
        if key in self.flat:
            self.used.add(key)
        v = self.flat.get(key)
        return default if _empty(v) else v

    def peek(self, key: str) -> Any:
        v = self.flat.get(key)
        return None if _empty(v) else v

    def set(self, name: str, value: Any, key: str, theirs: Any = None) -> None:
        self.out.fields[name] = value
        self.out.mapped = [m for m in self.out.mapped if m.field != name]
        self.out.mapped.append(Mapped(key, theirs if theirs is not None else self.flat.get(key), name, value))
        self.used.add(key)

    def also(self, key: str, what: str) -> None:
        """A key read only as part of another's decision: listed as used, with what it meant."""
        if key in self.flat and key not in self.used:
            self.out.mapped.append(Mapped(key, self.flat[key], "", what))
            self.used.add(key)

    def note(self, line: str) -> None:
        self.out.notes.append(line)

    def problem(self, name: str, line: str) -> None:
        self.out.problems[name] = line

    def finish(self) -> WorkloadFile:
        for key, value in self.flat.items():
            if key in self.used:
                continue
            if _empty(value):
                self.out.ignored.append(Ignored(key, value, EMPTY))
                continue
            top = key.split(".")[0]
            detail = self.not_modelled.get(key, self.not_modelled.get(top))
            if detail is not None and value is not False:
                self.out.ignored.append(Ignored(key, value, NOT_MODELLED, detail))
            elif detail is not None or key in self.no_effect or top in self.no_effect:
                self.out.ignored.append(Ignored(key, value, NO_EFFECT))
            else:
                self.out.ignored.append(Ignored(key, value, NOT_READ))
        return self.out


def _as_bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes", "auto")
    return bool(v)


def _as_int(r: _Reader, key: str) -> int | None:
    v = r.get(key)
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise InputError("--workload", f"{r.out.path}: {key} must be an integer, got {v!r}") from None


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


# ---------------------------------------------------------------------------------------------------------------
# axolotl


_AXOLOTL_NO_EFFECT = {
    "datasets", "test_datasets", "dataset_prepared_path", "val_set_size", "output_dir", "num_epochs", "max_steps",
    "learning_rate", "lr_scheduler", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio", "weight_decay",
    "logging_steps", "save_steps", "saves_per_epoch", "evals_per_epoch", "eval_steps", "save_strategy",
    "eval_strategy", "wandb_project", "wandb_entity", "wandb_watch", "wandb_name", "wandb_log_model",
    "hub_model_id", "hub_strategy", "special_tokens", "tokens", "chat_template", "tokenizer_type", "tokenizer_config",
    "model_type", "trust_remote_code", "strict", "seed", "train_on_inputs", "group_by_length", "lora_alpha",
    "lora_dropout", "lora_fan_in_fan_out", "lora_model_dir", "resume_from_checkpoint", "early_stopping_patience",
    "local_rank", "debug", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon", "save_safetensors",
    "save_total_limit", "eval_table_size", "eval_max_new_tokens", "loss_watchdog_threshold", "loss_watchdog_patience",
    "shuffle_merged_datasets", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_prefetch_factor",
    "tf32", "pad_to_sequence_len", "eval_sample_packing", "is_llama_derived_model", "is_mistral_derived_model",
    "hf_use_auth_token", "push_dataset_to_hub", "dataset_processes", "gptq_groupsize", "gptq_model_v1",
    "torchdistx_path", "rl", "orpo_alpha", "fsdp_version", "gradient_checkpointing_kwargs", "lora_mlp_kernel",
    "lora_qkv_kernel", "lora_o_kernel", "ddp_timeout", "ddp_find_unused_parameters", "plugins",
}  # fmt: skip
_AXOLOTL_NOT_MODELLED = {
    "load_in_8bit": "8-bit (LLM.int8) base weights: sized as 16-bit (over)",
    "liger_kernel": "Liger's fused kernels (chunked cross-entropy) use less memory than sized",
    "liger_fused_linear_cross_entropy": "fused linear cross-entropy never builds the logits: less than sized",
    "liger_cross_entropy": "Liger's cross-entropy uses less memory than sized",
    "cut_cross_entropy": "Cut Cross-Entropy never builds the logits: less than sized",
    "unsloth_lora_mlp": "Unsloth's kernels change activation memory",
    "unsloth_lora_qkv": "Unsloth's kernels change activation memory",
    "unsloth_lora_o": "Unsloth's kernels change activation memory",
    "unsloth_cross_entropy_loss": "Unsloth's cross-entropy uses less memory than sized",
    "lora_modules_to_save": "modules_to_save train a full copy of those modules (more than sized)",
    "lora_on_cpu": "LoRA loaded on the CPU",
    "gpu_memory_limit": "a per-GPU memory cap with device_map offload",
    "torch_compile": "torch.compile changes activation memory",
    "relora_steps": "ReLoRA",
    "peft_use_dora": "DoRA keeps a magnitude vector and a weight-norm activation per adapted linear",
    "unfrozen_parameters": "only the named parameters train (less than a full fine-tune)",
    "context_parallel_size": "context parallelism splits the sequence over GPUs",
    "tensor_parallel_size": "tensor parallelism",
    "activation_offloading": "activations offloaded to the CPU: less than sized",
    "xformers_attention": "xformers attention sized as PyTorch SDPA",
    "s2_attention": "shifted-sparse attention",
    "eval_batch_size": "the evaluation batch (no gradients) may set the peak only when far larger than training's",
    "neftune_noise_alpha": "",
}


def _axolotl(r: _Reader) -> None:
    r.known(_AXOLOTL_NO_EFFECT, _AXOLOTL_NOT_MODELLED)
    model_key = "base_model_config" if r.has("base_model_config") else "base_model"
    if r.has(model_key):
        r.set("model", str(r.get(model_key)), model_key)
        if model_key == "base_model_config":
            r.also("base_model", "superseded by base_model_config")
    adapter = str(r.get("adapter") or "").lower()
    four_bit = _as_bool(r.get("load_in_4bit", False))
    if adapter in ("lora", "qlora"):
        method = "qlora" if adapter == "qlora" or four_bit else "lora"
        r.set("method", method, "adapter")
        if method == "qlora" and adapter == "lora":
            r.note("adapter: lora with load_in_4bit sized as QLoRA (NF4 base weights)")
        r.also("load_in_4bit", f"method = {method}" if four_bit else "off")
    elif adapter:
        r.problem("method", f"adapter: {adapter!r} is not modelled; gpuready sizes lora and qlora (or none: full)")
    else:
        r.set("method", "full", "adapter", None)
        r.out.mapped[-1] = Mapped("adapter", None, "method", "full")
    if r.has("lora_r"):
        r.set("lora_r", _as_int(r, "lora_r"), "lora_r")
    if _as_bool(r.get("lora_target_linear", False)):
        r.set("lora_targets", None, "lora_target_linear", True)
        r.out.mapped[-1] = Mapped("lora_target_linear", True, "lora_targets", "every linear layer")
        r.also("lora_target_modules", "superseded by lora_target_linear")
    elif r.has("lora_target_modules"):
        targets = r.get("lora_target_modules")
        names = [str(t) for t in targets] if isinstance(targets, list) else [str(targets)]
        if [n.lower() for n in names] == ["all-linear"]:  # peft's shorthand for every linear layer
            r.set("lora_targets", None, "lora_target_modules", targets)
            r.out.mapped[-1] = Mapped("lora_target_modules", targets, "lora_targets", "every linear layer")
        else:
            r.set("lora_targets", names, "lora_target_modules", targets)
    seq = _as_int(r, "sequence_len")
    if seq is not None:
        r.set("seq", seq, "sequence_len")
    else:
        r.note("sequence_len not set: axolotl's default 2048 used")
        r.out.fields["seq"] = 2048
    _packing(r, "sample_packing", "sequence_len")
    micro = _as_int(r, "micro_batch_size")
    accum = _as_int(r, "gradient_accumulation_steps")
    if micro is not None:
        r.set("batch", micro, "micro_batch_size")
    elif r.has("batch_size"):
        total = _as_int(r, "batch_size") or 1
        r.set("batch", max(1, total // (accum or 1)), "batch_size", total)
        r.note("batch_size is the per-GPU batch over all accumulation steps; micro-batch = batch_size / accumulation")
    if accum is not None:
        r.set("grad_accum", accum, "gradient_accumulation_steps")
    gc = r.get("gradient_checkpointing")
    if gc is not None:
        r.set("grad_ckpt", gc is True or str(gc).lower() in ("true", "unsloth", "offload"), "gradient_checkpointing")
        if str(gc).lower() in ("unsloth", "offload"):
            r.note(f"gradient_checkpointing: {gc} offloads checkpoints to the CPU; sized as on the GPU (over)")
    _precision_16(r, bf16_means="bf16")
    if r.has("optimizer"):
        _map_optim(r, "optimizer", r.get("optimizer"))
    if _as_bool(r.get("flash_attention", False)):
        r.set("attn", "flash", "flash_attention")
    elif _as_bool(r.get("sdp_attention", False)):
        r.set("attn", "sdpa", "sdp_attention")
    elif _as_bool(r.get("eager_attention", False)):
        r.set("attn", "eager", "eager_attention")
    if r.has("deepspeed"):
        _zero_stage(r, "deepspeed", r.get("deepspeed"))
    if r.has("fsdp") or r.has("fsdp_config.fsdp_version") or r.has("fsdp_version"):
        key = "fsdp" if r.has("fsdp") else "fsdp_version" if r.has("fsdp_version") else "fsdp_config.fsdp_version"
        _fsdp(r, key, r.get(key))


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


# ---------------------------------------------------------------------------------------------------------------
# LLaMA-Factory


_LF_NO_EFFECT = {
    "template", "dataset", "eval_dataset", "dataset_dir", "max_samples", "overwrite_cache", "preprocessing_num_workers",
    "dataloader_num_workers", "output_dir", "logging_steps", "save_steps", "plot_loss", "overwrite_output_dir",
    "save_only_model", "report_to", "learning_rate", "num_train_epochs", "lr_scheduler_type", "warmup_ratio",
    "warmup_steps", "ddp_timeout", "resume_from_checkpoint", "val_size", "per_device_eval_batch_size",
    "eval_strategy", "eval_steps", "lora_alpha", "lora_dropout", "trust_remote_code", "do_train", "max_grad_norm",
    "weight_decay", "seed", "save_strategy", "save_total_limit", "include_num_input_tokens_seen", "flash_attn_kwargs",
    "quantization_method", "quantization_type", "double_quantization", "tf32", "streaming", "tokenized_path",
    "adapter_name_or_path", "export_dir", "train_on_prompt", "mask_history", "default_system", "enable_thinking",
    "loraplus_lr_ratio", "hub_model_id", "push_to_hub", "run_name",
}  # fmt: skip
_LF_NOT_MODELLED = {
    "enable_liger_kernel": "Liger's fused kernels use less memory than sized",
    "use_unsloth": "Unsloth's kernels change activation memory",
    "use_unsloth_gc": "Unsloth's checkpointing offloads to the CPU",
    "upcast_layernorm": "norm weights upcast to fp32",
    "upcast_lmhead_output": "lm_head output upcast to fp32 (a larger logits tensor)",
    "additional_target": "modules trained in full next to LoRA (more than sized)",
    "use_dora": "DoRA keeps a magnitude vector and a weight-norm activation per adapted linear",
    "freeze_trainable_layers": "freeze tuning",
    "use_badam": "BAdam trains one block at a time (less than sized)",
    "use_galore": "GaLore projects optimizer states",
    "use_apollo": "APOLLO projects optimizer states",
    "shift_attn": "shifted-sparse attention",
    "neat_packing": "packing without cross-attention between samples",
    "moe_aux_loss_coef": "",
    "torch_compile": "torch.compile changes activation memory",
    "pref_beta": "",
    "pref_loss": "",
}


def _llamafactory(r: _Reader) -> None:
    r.known(_LF_NO_EFFECT, _LF_NOT_MODELLED)
    if r.has("model_name_or_path"):
        r.set("model", str(r.get("model_name_or_path")), "model_name_or_path")
    stage = str(r.get("stage") or "sft").lower()
    if stage in ("sft", "pt"):
        r.out.mapped.append(Mapped("stage", stage, "task", "train"))
    else:
        why = "(a reference or reward model besides the policy) is not modelled; sft and pt are"
        r.problem("task", f"stage: {stage!r} {why}")
    r.out.fields["task"] = "train"
    ftype = str(r.get("finetuning_type") or "lora").lower()
    qbit = _as_int(r, "quantization_bit")
    if ftype == "full":
        r.set("method", "full", "finetuning_type", ftype)
    elif ftype == "lora":
        if qbit == 4:
            r.set("method", "qlora", "finetuning_type", ftype)
            r.out.mapped.append(Mapped("quantization_bit", 4, "method", "qlora"))
        else:
            r.set("method", "lora", "finetuning_type", ftype)
            if qbit is not None:
                r.not_modelled["quantization_bit"] = f"{qbit}-bit base weights: sized as 16-bit"
                r.used.discard("quantization_bit")
        if "finetuning_type" not in r.flat:
            r.note("finetuning_type not set: LLaMA-Factory's default, lora")
    else:
        r.problem("method", f"finetuning_type: {ftype!r} is not modelled; gpuready sizes full and lora")
    if r.has("lora_rank"):
        r.set("lora_r", _as_int(r, "lora_rank"), "lora_rank")
    target = r.get("lora_target")
    if target is not None:
        names = target if isinstance(target, list) else [t.strip() for t in str(target).split(",") if t.strip()]
        if [n.lower() for n in names] == ["all"]:
            r.set("lora_targets", None, "lora_target", target)
            r.out.mapped[-1] = Mapped("lora_target", target, "lora_targets", "every linear layer")
        else:
            r.set("lora_targets", names, "lora_target", target)
    seq = _as_int(r, "cutoff_len")
    if seq is not None:
        r.set("seq", seq, "cutoff_len")
    else:
        r.out.fields["seq"] = 2048
        r.note("cutoff_len not set: LLaMA-Factory's default 2048 used")
    _packing(r, "packing", "cutoff_len")
    micro = _as_int(r, "per_device_train_batch_size")
    if micro is not None:
        r.set("batch", micro, "per_device_train_batch_size")
    accum = _as_int(r, "gradient_accumulation_steps")
    if accum is not None:
        r.set("grad_accum", accum, "gradient_accumulation_steps")
    # LLaMA-Factory turns gradient checkpointing on unless disable_gradient_checkpointing is set
    # (model/model_utils/checkpointing.py logs "Gradient checkpointing enabled.")
    off = _as_bool(r.get("disable_gradient_checkpointing", False))
    r.set("grad_ckpt", not off, "disable_gradient_checkpointing", off)
    if not off and "disable_gradient_checkpointing" not in r.flat:
        r.note("gradient checkpointing on: LLaMA-Factory's default (disable_gradient_checkpointing: false)")
    # trainable parameters are upcast to fp32 unless pure_bf16 (model/adapter.py: "Upcasting trainable params
    # to float32"); the frozen base stays in the compute dtype
    pure = _as_bool(r.get("pure_bf16", False))
    if pure:
        r.set("precision", "bf16", "pure_bf16", True)
    else:
        _precision_16(r, bf16_means="mixed" if ftype == "full" else "bf16")
        if ftype == "full" and r.out.fields.get("precision") == "mixed":
            r.note("full fine-tuning without pure_bf16: LLaMA-Factory keeps fp32 weights under bf16 autocast (mixed)")
    if r.has("optim"):
        _map_optim(r, "optim", r.get("optim"))
    if r.has("flash_attn"):
        _map_attn(r, "flash_attn", r.get("flash_attn"))
    if r.has("deepspeed"):
        _zero_stage(r, "deepspeed", r.get("deepspeed"))


# ---------------------------------------------------------------------------------------------------------------
# torchtune


_TT_NO_EFFECT = {
    "output_dir", "tokenizer._component_", "tokenizer.path", "tokenizer.merges_file", "tokenizer.prompt_template",
    "dataset", "seed", "shuffle", "epochs", "max_steps_per_epoch", "lr_scheduler", "optimizer.lr",
    "optimizer.weight_decay", "optimizer.betas", "optimizer.eps", "optimizer.fused", "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats", "log_level", "profiler", "device", "resume_from_checkpoint", "save_adapter_weights_only",
    "model.lora_alpha", "model.lora_dropout", "loss._component_", "checkpointer._component_",
    "checkpointer.checkpoint_files", "checkpointer.recipe_checkpoint", "checkpointer.output_dir",
    "checkpointer.model_type", "checkpointer.adapter_checkpoint", "clip_grad_norm", "run_val_every_n_steps",
    "dataset_val", "batch_size_val", "custom_sharded_layers", "fsdp_reshard_after_forward", "quantizer",
}  # fmt: skip
_TT_NOT_MODELLED = {
    "enable_activation_offloading": "activations offloaded to the CPU: less than sized",
    "optimizer_in_bwd": "optimizer step fused into backward: gradients freed per parameter (less than sized)",
    "compile": "torch.compile changes activation memory",
    "fsdp_cpu_offload": "parameters offloaded to the CPU: less than sized",
    "model.apply_lora_to_output": "LoRA on the output projection (the adapter is sized without it)",
    "model.use_dora": "DoRA keeps a magnitude vector and a weight-norm activation per adapted linear",
    "model.quantize_base": "",
    "tensor_parallel_dim": "tensor parallelism",
}
# torchtune module names -> transformers' (peft targets the HF names); torchtune's MLP: w1 gate, w2 down, w3 up
_TT_ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}


@functools.cache
def _torchtune_builders() -> dict[str, str]:
    text = resources.files("gpuready.workload").joinpath("data/torchtune_models.json").read_text(encoding="utf-8")
    builders: dict[str, str] = json.loads(text)["builders"]
    return builders


def _torchtune(r: _Reader) -> None:
    r.known(_TT_NO_EFFECT, _TT_NOT_MODELLED)
    component = str(r.get("model._component_") or "")
    builder = component.rsplit(".", 1)[-1]
    method = "full"
    for prefix, m in (("qlora_", "qlora"), ("lora_", "lora")):
        if builder.startswith(prefix):
            builder, method = builder[len(prefix) :], m
            break
    if _as_bool(r.get("model.quantize_base", False)):
        method = "qlora"
    base = re.sub(r"_(base|instruct)$", "", builder)
    ckpt_dir = r.peek("checkpointer.checkpoint_dir")
    local = None
    if ckpt_dir is not None:
        d = Path(str(ckpt_dir)).expanduser()
        if not d.is_absolute():
            d = Path(r.out.path).parent / d
        if (d / "config.json").is_file():
            local = d
    if local is not None:
        r.set("model", str(local), "checkpointer.checkpoint_dir", ckpt_dir)
        r.out.mapped.append(Mapped("model._component_", component, "model", "(the checkpoint's config.json)"))
    elif base in _torchtune_builders():
        r.set("model", _torchtune_builders()[base], "model._component_", component)
        if ckpt_dir is not None:
            r.used.add("checkpointer.checkpoint_dir")
            r.note(f"checkpointer.checkpoint_dir {ckpt_dir} has no config.json here; the model is {component}'s shape")
    elif component:
        r.problem("model", f"model._component_: {component} is not a builder gpuready knows; give MODEL")
    r.set("method", method, "model._component_", component)
    if method != "full":
        if r.has("model.lora_rank"):
            r.set("lora_r", _as_int(r, "model.lora_rank"), "model.lora_rank")
        attn = r.get("model.lora_attn_modules") or []
        names = [_TT_ATTN.get(str(a), str(a)) for a in attn]
        if _as_bool(r.get("model.apply_lora_to_mlp", False)):
            names += ["gate_proj", "up_proj", "down_proj"]
        if names:
            r.set("lora_targets", names, "model.lora_attn_modules", attn)
        mlp = "lora_targets += gate_proj, up_proj, down_proj" if "up_proj" in names else "off"
        r.also("model.apply_lora_to_mlp", mlp)
    seq = _as_int(r, "tokenizer.max_seq_len")
    if seq is not None:
        r.set("seq", seq, "tokenizer.max_seq_len")
    else:
        r.note("tokenizer.max_seq_len not set: sequences as long as the data; gpuready's default 2048 used (--seq)")
    packed = r.peek("dataset.packed")
    if packed is not None:
        r.used.add("dataset.packed")
        r.out.mapped.append(
            Mapped("dataset.packed", packed, "", "rows packed to full length" if packed else "seq is the upper bound")
        )
    if r.has("batch_size"):
        r.set("batch", _as_int(r, "batch_size"), "batch_size")
    if r.has("gradient_accumulation_steps"):
        r.set("grad_accum", _as_int(r, "gradient_accumulation_steps"), "gradient_accumulation_steps")
    if r.has("enable_activation_checkpointing"):
        v = _as_bool(r.get("enable_activation_checkpointing"))
        r.set("grad_ckpt", v, "enable_activation_checkpointing")
    dtype = str(r.get("dtype") or "").lower()
    if dtype:
        table = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32", "fp16": "fp16"}
        if dtype in table:
            r.set("precision", table[dtype], "dtype")
        else:
            r.problem("precision", f"dtype: {dtype!r} is not modelled; bf16, fp32")
    if r.has("optimizer._component_"):
        _map_optim(r, "optimizer._component_", r.get("optimizer._component_"))
    if r.has("fsdp_cpu_offload") or r.has("fsdp_reshard_after_forward") or r.has("data_parallel_shard_dim"):
        key = next(k for k in ("fsdp_reshard_after_forward", "fsdp_cpu_offload", "data_parallel_shard_dim") if r.has(k))
        r.set("shard", "fsdp", key, r.peek(key))
        r.problem("gpus", f"{key}: a distributed recipe (FSDP2); say how many GPUs with --gpus N")
    loss = str(r.peek("loss._component_") or "").lower()
    if "chunked" in loss or "linearcrossentropy" in loss:
        r.not_modelled["loss._component_"] = "chunked cross-entropy never holds the whole logits: less than sized"
        r.no_effect.discard("loss._component_")


# ---------------------------------------------------------------------------------------------------------------
# TRL SFTConfig / transformers TrainingArguments (JSON, a .to_json_string() dump, or TRL's YAML config)


_TRL_NO_EFFECT = {
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "eval_strategy", "evaluation_strategy",
    "prediction_loss_only", "per_device_eval_batch_size", "eval_accumulation_steps", "eval_delay", "learning_rate",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "num_train_epochs", "max_steps",
    "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps", "log_level", "log_level_replica",
    "log_on_each_node", "logging_dir", "logging_strategy", "logging_first_step", "logging_steps",
    "logging_nan_inf_filter",
    "save_strategy", "save_steps", "save_total_limit", "save_safetensors", "save_on_each_node", "save_only_model",
    "seed", "data_seed", "jit_mode_eval", "bf16_full_eval", "fp16_full_eval", "local_rank", "ddp_backend",
    "tpu_num_cores", "dataloader_drop_last", "eval_steps", "dataloader_num_workers", "dataloader_prefetch_factor",
    "past_index", "run_name", "disable_tqdm", "remove_unused_columns", "label_names", "load_best_model_at_end",
    "metric_for_best_model", "greater_is_better", "ignore_data_skip", "report_to", "ddp_find_unused_parameters",
    "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "skip_memory_metrics", "push_to_hub", "resume_from_checkpoint", "hub_model_id", "hub_strategy", "hub_token",
    "hub_private_repo", "hub_always_push", "gradient_checkpointing_kwargs", "include_inputs_for_metrics",
    "include_for_metrics", "eval_do_concat_batches", "fp16_backend", "push_to_hub_model_id",
    "push_to_hub_organization", "push_to_hub_token", "mp_parameters", "auto_find_batch_size", "full_determinism",
    "ray_scope", "ddp_timeout", "use_mps_device", "dispatch_batches", "split_batches", "include_tokens_per_second",
    "include_num_input_tokens_seen", "neftune_noise_alpha", "optim_args", "accelerator_config", "debug",
    "batch_eval_metrics", "eval_on_start", "eval_use_gather_object", "average_tokens_across_devices", "use_cpu",
    "restore_callback_states_from_checkpoint", "length_column_name", "group_by_length", "_n_gpu",
    "half_precision_backend",
    "fp16_opt_level", "tf32", "dataset_text_field", "dataset_kwargs", "dataset_num_proc", "eos_token", "pad_token",
    "completion_only_loss", "assistant_only_loss", "chat_template_path", "dataset_name", "dataset_config",
    "dataset_train_split", "dataset_test_split", "lora_alpha", "lora_dropout", "lora_task_type", "trust_remote_code",
    "model_revision", "tokenizer_name_or_path", "hub_revision", "project", "trackio_space_id",
    "liger_kernel_config", "torch_empty_cache_steps", "eval_packing", "shuffle_dataset", "activation_offloading_kwargs",
    "fsdp_min_num_params", "fsdp_transformer_layer_cls_to_wrap", "xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt",
    "fsdp_config", "packing_strategy", "padding_free", "pad_to_multiple_of", "use_liger_kernel_for_loss",
    "activation_checkpointing_kwargs", "label_smoothing_factor", "use_cache", "trackio_bucket_id",
    "trackio_static_space_id", "enable_jit_checkpoint", "dataloader_multiprocessing_context", "dataloader_in_order",
    "train_sampling_strategy", "ddp_static_graph", "model_init_kwargs",
}  # fmt: skip
_TRL_NOT_MODELLED = {
    "use_liger_kernel": "Liger's fused kernels (no logits tensor) use less memory than sized",
    "torch_compile": "torch.compile changes activation memory",
    "activation_offloading": "activations offloaded to the CPU: less than sized",
    "load_in_8bit": "8-bit (LLM.int8) base weights: sized as 16-bit (over)",
    "use_dora": "DoRA keeps a magnitude vector and a weight-norm activation per adapted linear",
    "lora_modules_to_save": "modules trained in full next to LoRA (more than sized)",
    "fsdp_config.offload_params": "parameters offloaded to the CPU: less than sized",
    "optim_target_modules": "GaLore/APOLLO projected optimizer states",
    "parallelism_config": "tensor/context parallelism",
    "torch_compile_backend": "",
    "torch_compile_mode": "",
}


# Where TRL's SFTConfig defaults differ from TrainingArguments' (TRL 1.x, trl/trainer/sft_config.py: "These parameters
# have default values different from TrainingArguments"): they apply when the file is a TRL config that leaves them out
_SFT_DEFAULTS: dict[str, Any] = {"max_length": 1024, "gradient_checkpointing": True, "bf16": True}
# keys of TRL's SFTConfig / ModelConfig that TrainingArguments does not have
_SFT_KEYS = {
    "max_length", "max_seq_length", "packing", "packing_strategy", "padding_free", "dataset_text_field",
    "completion_only_loss", "assistant_only_loss", "loss_type", "model_init_kwargs", "use_peft", "model_name_or_path",
    "load_in_4bit", "lora_r", "lora_target_modules", "dataset_name", "chat_template_path", "eos_token",
}  # fmt: skip


def _is_sft_config(r: _Reader) -> bool:
    return any(k.split(".")[0] in _SFT_KEYS for k in r.flat)


def _trainer_precision(r: _Reader, sft: bool) -> None:
    """The Trainer's bf16/fp16 are autocast switches; the weights keep the dtype the model was loaded in. transformers
    5's from_pretrained loads the checkpoint's own dtype when given none (dtype="auto", modeling_utils.py), and so does
    TRL's create_model_from_path; transformers 4 loaded fp32. A transformers 4 dump carries push_to_hub_token, which
    5 dropped."""
    keys = ("model_init_kwargs.torch_dtype", "model_init_kwargs.dtype", "dtype", "torch_dtype")
    key = next((k for k in keys if r.has(k)), None)
    dtype = str(r.peek(key)).lower().removeprefix("torch.") if key else None
    bf16, fp16 = r.peek("bf16"), r.peek("fp16")
    if sft and bf16 is None and not _as_bool(fp16 or False):
        bf16 = _SFT_DEFAULTS["bf16"]
        r.note("no bf16 in the file: TRL's SFTConfig turns bf16 autocast on by default")
    qlora = r.out.fields.get("method") == "qlora"
    switch = _as_bool(bf16 or False) or _as_bool(fp16 or False)  # the Trainer's autocast
    if dtype in ("bfloat16", "bf16", "float16", "fp16", "half"):
        assert key is not None
        r.set("precision", "bf16" if "b" in dtype else "fp16", key, r.peek(key))
        r.out.fields["autocast"] = switch
        r.also("bf16", "autocast over the 16-bit weights" if _as_bool(bf16 or False) else "off")
        r.also("fp16", "autocast over the 16-bit weights" if _as_bool(fp16 or False) else "off")
        return
    transformers4 = "push_to_hub_token" in r.flat
    if dtype == "auto" or (dtype is None and not transformers4) or qlora:
        # the checkpoint's dtype: bf16 for most published LLMs (GPT-2 is fp32, Llama 2 and Pythia fp16)
        half = "fp16" if (fp16 is not None and _as_bool(fp16)) else "bf16"
        r.out.fields["precision"] = half
        r.out.fields["autocast"] = switch
        on = f"precision = {half}, under autocast"
        r.also("bf16", on if half == "bf16" and switch else "off")
        r.also("fp16", on if half == "fp16" else "off")
        if key is not None:
            r.also(key, "the checkpoint's own dtype")
        if qlora:
            r.note(
                f"QLoRA: the 4-bit base computes in bnb_4bit_compute_dtype, sized as {half}; embeddings, norms and "
                "lm_head in the checkpoint's dtype"
            )
        else:
            why = "dtype: auto" if dtype == "auto" else "no model dtype in the file"
            r.note(
                f"{why}: transformers 5 (and TRL) load the checkpoint's own dtype, sized as {half} (that of most "
                "published LLMs); give --precision mixed for an fp32 checkpoint (GPT-2), --precision fp16 for an "
                "fp16 one (Llama 2, Pythia)"
            )
        return
    if key is not None:
        r.also(key, "fp32 weights")
    if sft and r.peek("bf16") is None and bf16:
        r.out.fields["precision"] = "mixed"
    else:
        _precision_16(r, bf16_means="mixed")
    if r.out.fields.get("precision") == "mixed":
        why = "transformers 4 (this dump's version) loads fp32 when given no dtype" if dtype is None else "fp32 weights"
        r.note(
            f"{why}: fp32 weights under bf16 autocast (the Trainer's mixed precision); give --precision bf16 if the "
            "script loads the model in bf16"
        )


def _trl(r: _Reader) -> None:
    r.known(_TRL_NO_EFFECT, _TRL_NOT_MODELLED)
    if r.has("model_name_or_path"):
        r.set("model", str(r.get("model_name_or_path")), "model_name_or_path")
    elif r.has("model_init_kwargs.pretrained_model_name_or_path"):
        r.set("model", str(r.get("model_init_kwargs.pretrained_model_name_or_path")), "model_init_kwargs")
    # PEFT: TRL's ModelConfig (use_peft, lora_r, lora_target_modules, load_in_4bit); TrainingArguments has none
    if _as_bool(r.get("use_peft", False)):
        four = _as_bool(r.get("load_in_4bit", False))
        r.set("method", "qlora" if four else "lora", "use_peft", True)
        if r.has("lora_r"):
            r.set("lora_r", _as_int(r, "lora_r"), "lora_r")
        targets = r.get("lora_target_modules")
        if targets is not None:
            names = targets if isinstance(targets, list) else [str(targets)]
            if [str(n).lower() for n in names] in (["all-linear"], ["all"]):
                r.set("lora_targets", None, "lora_target_modules", targets)
                r.out.mapped[-1] = Mapped("lora_target_modules", targets, "lora_targets", "every linear layer")
            else:
                r.set("lora_targets", names, "lora_target_modules", targets)
        if four:
            r.out.fields["lora_dtype"] = "bf16"
            r.note(
                "QLoRA under TRL's SFTTrainer: recent TRL casts the adapters of a 4-bit model to bf16 "
                "(sft_trainer.py), sized so (--lora-dtype bf16); give --lora-dtype fp32 for a TRL that keeps peft's "
                "fp32 adapters"
            )
    else:
        r.also("use_peft", "method = full")
        r.note(
            "no PEFT settings in the file (TrainingArguments has none): sized as full fine-tuning; "
            "give --method lora if the script wraps the model with peft"
        )
    sft = _is_sft_config(r)
    seq_key = next((k for k in ("max_length", "max_seq_length") if r.has(k)), None)
    if seq_key:
        r.set("seq", _as_int(r, seq_key), seq_key)
        r.also("max_seq_length", f"superseded by {seq_key}")
    elif sft:
        r.out.fields["seq"] = _SFT_DEFAULTS["max_length"]
        r.note(f"no max_length in the file: TRL's SFTConfig default {_SFT_DEFAULTS['max_length']} used")
    else:
        r.note("no max_length in the file: gpuready's default 2048 used (--seq)")
    if "packing" in r.flat:
        _packing(r, "packing", seq_key or "--seq")
    if r.has("per_device_train_batch_size"):
        r.set("batch", _as_int(r, "per_device_train_batch_size"), "per_device_train_batch_size")
    if r.has("gradient_accumulation_steps"):
        r.set("grad_accum", _as_int(r, "gradient_accumulation_steps"), "gradient_accumulation_steps")
    # transformers 5 renamed gradient_checkpointing to activation_checkpointing (a dump holds both)
    ckpt_key = next((k for k in ("activation_checkpointing", "gradient_checkpointing") if k in r.flat), None)
    if ckpt_key is not None:
        r.set("grad_ckpt", _as_bool(r.get(ckpt_key)), ckpt_key)
        r.also("gradient_checkpointing", "the same as activation_checkpointing")
    elif sft:
        r.out.fields["grad_ckpt"] = _SFT_DEFAULTS["gradient_checkpointing"]
        r.note("no gradient_checkpointing in the file: TRL's SFTConfig turns it on by default")
    _trainer_precision(r, sft)
    if r.out.fields.get("lora_dtype") == "bf16" and r.out.fields.get("precision") != "bf16":
        del r.out.fields["lora_dtype"]  # bf16 adapters are modelled over bf16 weights only
        r.note("QLoRA in fp16: TRL's bf16 adapters not modelled over fp16 weights; sized with fp32 adapters (over)")
    loss = r.peek("loss_type")
    if loss is not None and str(loss).lower() == "chunked_nll":
        r.not_modelled["loss_type"] = "chunked cross-entropy never holds the whole logits: less than sized"
    elif sft and loss is None:
        r.note(
            "no loss_type in the file: recent TRL (1.x) defaults to chunked_nll (lm_head and cross-entropy in chunks, "
            "never the whole logits), not modelled: sized with the whole logits (over); loss_type: nll is sized exactly"
        )
        r.also("loss_type", "unset")
    else:
        r.also("loss_type", "the whole logits, as sized")
    if r.has("optim"):
        _map_optim(r, "optim", r.get("optim"))
    elif _as_bool(r.peek("adafactor") or False):
        r.set("optim", "adafactor", "adafactor")
    r.also("adafactor", "superseded by optim")
    if r.has("attn_implementation"):
        _map_attn(r, "attn_implementation", r.get("attn_implementation"))
    elif r.has("model_init_kwargs.attn_implementation"):
        _map_attn(r, "model_init_kwargs.attn_implementation", r.get("model_init_kwargs.attn_implementation"))
    ds = r.peek("deepspeed")
    if ds is not None:
        _zero_stage(r, "deepspeed", ds)
    fsdp = r.peek("fsdp")
    if fsdp is not None and fsdp is not False:
        _fsdp(r, "fsdp", fsdp)


_TRANSLATORS = {"axolotl": _axolotl, "llamafactory": _llamafactory, "torchtune": _torchtune, "trl": _trl}
