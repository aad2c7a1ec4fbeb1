"""Built-in model presets (data/presets.json) and name resolution: preset, hub id, config.json, folder."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpuready.errors import ModelNotFoundError
from gpuready.models.spec import ModelSpec, spec_from_config


@dataclass(frozen=True)
class Preset:
    name: str
    hub_id: str
    source: str
    config: dict[str, Any]
    aliases: tuple[str, ...] = ()  # other names it answers to (names it had before)


@functools.cache
def load_presets() -> tuple[Preset, ...]:
    text = resources.files("gpuready.models").joinpath("data/presets.json").read_text(encoding="utf-8")
    return tuple(Preset(**{**p, "aliases": tuple(p.get("aliases", ()))}) for p in json.loads(text)["presets"])


@functools.cache
def _index() -> dict[str, Preset]:
    out: dict[str, Preset] = {}
    for p in load_presets():
        out[p.name.lower()] = p
        out[p.hub_id.lower()] = p
        out[p.hub_id.split("/")[-1].lower()] = p
        for alias in p.aliases:
            out[alias.lower()] = p
    return out


def find_preset(name: str) -> Preset | None:
    return _index().get(name.strip().lower())


@functools.cache
def resolve_model(name: str, family: str | None = None) -> ModelSpec:
    """A preset name or hub id, a config.json, a model folder, or a hub id not in the presets (from the local
    Hugging Face cache, else fetched). `family` sizes it as that model_type (`--as-family`)."""
    preset = find_preset(name)
    if preset is not None:
        return spec_from_config(preset.config, preset.name, preset.source, family)
    path = Path(name).expanduser()
    if path.exists():
        from gpuready.models.local import spec_from_path

        return spec_from_path(path, family)
    if "/" in name and not name.startswith((".", "/")):
        from gpuready.models.hub import fetch_config

        return spec_from_config(fetch_config(name), name, f"https://huggingface.co/{name}", family)
    names = ", ".join(p.name for p in load_presets())
    raise ModelNotFoundError(name, f"not a preset, a file or a hub id; presets: {names}")
