"""Whether a model has an end-of-sequence token, which decides generate()'s minimum-length processors."""

from __future__ import annotations

from gpuready.models import resolve_model
from gpuready.models.spec import has_eos_token


def test_the_config_decides_and_else_the_config_class_default() -> None:
    assert has_eos_token({"eos_token_id": 151645}, "qwen3")
    assert not has_eos_token({"eos_token_id": None}, "llama")
    # transformers' Qwen2Config/Qwen3Config set no default; LlamaConfig defaults to 2
    assert not has_eos_token({}, "qwen3")
    assert has_eos_token({}, "llama")


def test_presets_follow_their_config_class() -> None:
    assert not resolve_model("qwen3-0.6b").eos_token
    assert not resolve_model("qwen1.5-moe-a2.7b").eos_token
    assert resolve_model("llama-3.1-8b").eos_token
    assert resolve_model("gemma-3-1b").eos_token
