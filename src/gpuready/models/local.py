"""Models on disk: a config.json, or a folder with config.json and/or *.safetensors.

For safetensors only the header is read (8-byte little-endian length, then JSON of name -> dtype, shape,
offsets; https://github.com/huggingface/safetensors#format): exact shapes and dtypes, no weights loaded.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuready.errors import InputError
from gpuready.models.spec import ModelSpec, spec_from_config
from gpuready.units import MIB

_MAX_HEADER = 100 * MIB  # the format's own limit on the JSON header


@dataclass(frozen=True)
class SafetensorsSummary:
    files: int
    tensors: int
    params: int
    stored_bytes: int  # bytes of tensor data in the files
    dtypes: dict[str, int]  # dtype -> elements


_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U32": 4,
    "U16": 2,
    "U64": 8,
}


def read_safetensors_header(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise InputError("MODEL", f"{path}: too short to be a safetensors file")
            (length,) = struct.unpack("<Q", raw)
            if length > _MAX_HEADER:
                raise InputError("MODEL", f"{path}: header of {length} bytes is not a safetensors header")
            header = json.loads(fh.read(length))
    except OSError as exc:
        raise InputError("MODEL", f"{path}: cannot read ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError("MODEL", f"{path}: header is not JSON; not a safetensors file") from None
    if not isinstance(header, dict):
        raise InputError("MODEL", f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    return header


def summarize_safetensors(files: list[Path]) -> SafetensorsSummary:
    params = stored = tensors = 0
    dtypes: dict[str, int] = {}
    for f in files:
        for info in read_safetensors_header(f).values():
            n = 1
            for dim in info["shape"]:
                n *= int(dim)
            tensors += 1
            params += n
            dtypes[info["dtype"]] = dtypes.get(info["dtype"], 0) + n
            start, end = info["data_offsets"]
            stored += int(end) - int(start)
    return SafetensorsSummary(len(files), tensors, params, stored, dtypes)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError("MODEL", f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise InputError("MODEL", f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise InputError("MODEL", f"{path}: expected a JSON object")
    # multimodal configs nest the language model
    if "text_config" in data and "hidden_size" not in data:
        inner = dict(data["text_config"])
        inner.setdefault("model_type", data.get("model_type"))
        return inner
    return data


def spec_from_path(path: Path, family: str | None = None) -> ModelSpec:
    if path.is_file():
        if path.suffix == ".safetensors":
            raise InputError("MODEL", f"{path}: give the folder holding config.json and the safetensors files")
        return spec_from_config(_read_config(path), path.parent.name or str(path), str(path), family)
    config = path / "config.json"
    shards = sorted(path.glob("*.safetensors"))
    if not config.is_file():
        raise InputError("MODEL", f"{path}: no config.json in this folder (needed for the layer shapes)")
    spec = spec_from_config(_read_config(config), path.name, str(config), family)
    if shards:
        summary = summarize_safetensors(shards)
        # the files' own count is exact for what is stored (tied embeddings are stored once)
        spec = replace(spec, params=summary.params)
    return spec
