"""Reading a workload file: parsing (TOML, JSON, or YAML with PyYAML imported only here), telling the format from
the content, and dispatching to the tool's translator."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from gpuready.errors import InputError
from gpuready.workload.formats.axolotl import _axolotl
from gpuready.workload.formats.llamafactory import _llamafactory
from gpuready.workload.formats.reader import _Reader
from gpuready.workload.formats.result import WorkloadFile
from gpuready.workload.formats.torchtune import _torchtune
from gpuready.workload.formats.trl import _trl


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


_TRANSLATORS = {"axolotl": _axolotl, "llamafactory": _llamafactory, "torchtune": _torchtune, "trl": _trl}
