"""The families added for issue 13: their layouts as transformers builds them, what each adds beyond a llama
decoder, and what the estimate says it leaves out."""

from __future__ import annotations

from typing import Any

import pytest

from gpuready.memory import estimate
from gpuready.memory.lm.context import make_ctx
from gpuready.models import find_preset, resolve_model
from gpuready.models.families import FAMILY_TYPES, family_table, unmodelled_features
from gpuready.models.spec import spec_from_config
from gpuready.workload import make_workload


def preset_config(name: str) -> dict[str, Any]:
    preset = find_preset(name)
    assert preset is not None
    return dict(preset.config)


def test_every_family_has_its_features_as_sourced_data() -> None:
    table = family_table()
    for mtype in FAMILY_TYPES:
        entry = table[mtype]
        assert entry["features"] and entry["source"].startswith("https://"), mtype
        assert isinstance(entry["modelled"], list) and isinstance(entry["not_modelled"], list), mtype
    assert any("MXFP4" in f for f in unmodelled_features("gpt_oss"))
    assert unmodelled_features("no_such_type") == ()


def test_gpt_neox_is_no_longer_sized_as_a_llama() -> None:
    """The issue's +28% on parameters: a GPT-NeoX config read as llama gets a gated (three-matrix) MLP."""
    cfg = preset_config("pythia-1b")
    as_family = spec_from_config(cfg, "pythia-1b")
    as_llama = spec_from_config({**cfg, "model_type": "llama"}, "pythia-1b")
    assert as_family.params == 1_011_781_632  # transformers' meta-device count (test_params checks it too)
    assert as_llama.params / as_family.params - 1 > 0.2
    names = [lin.name for lin in as_family.block_linears]
    assert names == ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]
    assert as_family.norm == "layer" and not as_family.gated_mlp and as_family.parallel_residual


def test_qwen2_moe_has_its_shared_expert_and_gate() -> None:
    spec = resolve_model("qwen1.5-moe-a2.7b")
    names = {lin.name: lin for lin in spec.block_linears}
    assert names["shared_expert.gate_proj"].out_features == 5632
    assert names["shared_expert_gate"].out_features == 1
    assert names["gate_proj"].count == 60 and spec.experts_per_token == 4


def test_gemma3_has_four_norms_qk_norms_and_five_local_layers_to_one_global() -> None:
    spec = resolve_model("gemma-3-1b")
    assert (spec.norms_per_layer, spec.qk_norm, spec.tied, spec.vocab) == (4, True, True, 262_144)
    assert (spec.sliding_window, spec.sliding_layers, spec.layers) == (512, 22, 26)


def test_gpt_oss_runs_eager_attention_and_says_what_is_not_modelled() -> None:
    spec = resolve_model("gpt-oss-20b")
    w = make_workload(model="gpt-oss-20b", task="infer", seq=1024)
    assert make_ctx(spec, w).backend == "eager"  # transformers has no SDPA path for its sinks
    lines = estimate(w).assumptions
    assert any(line.startswith("gpt_oss: not modelled:") and "MXFP4" in line for line in lines)


@pytest.mark.parametrize(
    ("name", "mtype"),
    [
        ("qwen3-30b-a3b", "qwen3_moe"),
        ("llama-4-scout", "llama4_text"),
        ("deepseek-v3", "deepseek_v3"),
        ("gpt-oss-120b", "gpt_oss"),
    ],
)
def test_large_families_estimate_in_the_arithmetic_mode(name: str, mtype: str) -> None:
    w = make_workload(model=name, method="lora", lora_targets="o_proj", grad_ckpt=True, seq=1024)
    result = estimate(w)
    spec = resolve_model(name)
    assert spec.model_type == mtype
    assert result.peak_allocated_bytes > spec.params * 2  # bf16 weights at least
    assert result.trainable_params > 0


def test_active_params_count_only_the_routed_experts() -> None:
    dense = resolve_model("llama-3.1-8b")
    assert dense.active_params == dense.params
    # Mixtral's paper (arXiv 2401.04088, section 2.1): "each token has access to 47B parameters, but only uses
    # 13B active parameters" (12.9B in its model card)
    mixtral = resolve_model("mixtral-8x7b")
    assert abs(mixtral.active_params / 12.9e9 - 1) < 0.01
    for name in ("qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3", "qwen1.5-moe-a2.7b"):
        spec = resolve_model(name)
        assert spec.active_params < spec.params / 4, name
    scout = resolve_model("llama-4-scout")  # transformers runs all 16 experts on every token
    assert scout.active_params == scout.params
