"""Parameter counts are exact: equal to what transformers counts for the same config on the meta device."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gpuready.errors import InputError
from gpuready.models import find_preset, load_presets, resolve_model
from gpuready.models.spec import VISION_TYPES
from gpuready.models.vision import build_transformers_vision, is_transformers_vision

LM_PRESETS = [p.name for p in load_presets() if p.config["model_type"] not in VISION_TYPES]
HF_VISION_PRESETS = [p.name for p in load_presets() if is_transformers_vision(p.config)]

# torchvision's published parameter counts (the "num_params" of each weights enum, torchvision docs
# https://pytorch.org/vision/stable/models.html); torchvision itself does not import beside the CPU torch
# wheel that CI uses, so the vision presets are checked against these and, where it imports, against it.
TORCHVISION_PARAMS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "vit_b_16": 86_567_656,
    "vit_l_16": 304_326_632,
}


def _meta_count(config: dict[str, object]) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = dict(config)
    model_type = str(cfg.pop("model_type"))
    hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.torch
@pytest.mark.parametrize("name", LM_PRESETS)
def test_language_model_params_match_transformers(name: str) -> None:
    preset = find_preset(name)
    assert preset is not None
    assert resolve_model(name).params == _meta_count(preset.config)


@pytest.mark.torch
@pytest.mark.parametrize("name", HF_VISION_PRESETS)
def test_transformers_vision_params_match_the_model_the_probe_builds(name: str) -> None:
    """The parameter count, and memory/vision_weights.py's tensors (the estimator makes a transformers encoder's
    parameters tensor by tensor, so the optimizer's states and temporaries too): the same tensors as the model the
    probe builds, and its buffers (SigLIP's int64 position ids) by their bytes; SigLIP's in the model's own order
    (ViT's and DINOv2's follow their history's allocation order instead)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gpuready.memory.vision_weights import hf_vision_tensors

    preset = find_preset(name)
    assert preset is not None
    with torch.device("meta"):
        model = build_transformers_vision(transformers, preset.config, torch.float32)
    real = [p.numel() for p in model.parameters()]
    assert resolve_model(name).params == sum(real)
    ours, buffers = hf_vision_tensors(resolve_model(name))
    assert sorted(ours) == sorted(real)
    assert buffers == [b.numel() * b.element_size() for b in model.buffers()]
    if preset.config["model_type"] == "siglip_vision_model":
        assert ours == real


def test_transformers_vision_presets_cover_vit_dinov2_and_siglip() -> None:
    types = {find_preset(n).config["model_type"] for n in HF_VISION_PRESETS}  # type: ignore[union-attr]
    assert types == {"vit", "dinov2", "siglip_vision_model"}


@pytest.mark.parametrize(("name", "published"), sorted(TORCHVISION_PARAMS.items()))
def test_vision_params_match_torchvision(name: str, published: int) -> None:
    assert resolve_model(name).params == published


def test_vision_params_match_torchvision_itself_where_it_imports() -> None:
    try:
        import torch
        import torchvision.models as tvm
    except Exception as exc:  # torchvision's CUDA build fails to load its ops beside the CPU torch wheel
        pytest.skip(f"torchvision does not import here: {exc}")
    for name in TORCHVISION_PARAMS:
        with torch.device("meta"):
            model = getattr(tvm, name)()
        assert resolve_model(name).params == sum(p.numel() for p in model.parameters()), name


def test_every_preset_has_a_source_and_a_hub_id() -> None:
    for p in load_presets():
        assert p.source.startswith("https://"), p.name
        assert "/" in p.hub_id, p.name


@pytest.mark.parametrize("alias", ["meta-llama/Llama-3.1-8B", "META-LLAMA/llama-3.1-8b", "Llama-3.1-8B"])
def test_hub_ids_resolve_to_presets_case_insensitively(alias: str) -> None:
    assert resolve_model(alias).name == "llama-3.1-8b"


def test_unknown_model_names_the_field() -> None:
    with pytest.raises(InputError) as info:
        resolve_model("no-such-model")
    assert info.value.field == "MODEL"


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    header: dict[str, object] = {}
    offset = 0
    sizes = {"BF16": 2, "F32": 4}
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return offset


def test_a_model_folder_reads_only_safetensors_headers(tmp_path: Path) -> None:
    config = dict(find_preset("qwen2.5-0.5b").config)  # type: ignore[union-attr]
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    _write_safetensors(tmp_path / "model.safetensors", {"a": ("BF16", [10, 20]), "b": ("F32", [5])})
    spec = resolve_model(str(tmp_path))
    assert spec.params == 205  # what the files hold, not what the config implies
    assert spec.hidden == 896


def test_a_folder_without_config_is_a_clear_error(tmp_path: Path) -> None:
    _write_safetensors(tmp_path / "model.safetensors", {"a": ("BF16", [2])})
    with pytest.raises(InputError, match=r"config\.json"):
        resolve_model(str(tmp_path))


def test_a_broken_safetensors_header_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(find_preset("gpt2").config), encoding="utf-8")  # type: ignore[union-attr]
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 4) + b"nope")
    with pytest.raises(InputError, match=r"not JSON"):
        resolve_model(str(tmp_path))


def test_a_local_config_json_works(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text(json.dumps(find_preset("llama-3.2-1b").config), encoding="utf-8")  # type: ignore[union-attr]
    assert resolve_model(str(f)).params == resolve_model("llama-3.2-1b").params
