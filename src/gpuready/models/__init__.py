"""Model presets, configs and exact parameter counts."""

from gpuready.models.presets import Preset, find_preset, load_presets, resolve_model
from gpuready.models.spec import Linear, ModelSpec, spec_from_config

__all__ = [
    "Linear",
    "ModelSpec",
    "Preset",
    "find_preset",
    "load_presets",
    "resolve_model",
    "spec_from_config",
]
