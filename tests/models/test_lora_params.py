"""LoRA's trainable parameters are exact: equal to what peft adapts on the meta device for the default targets.

peft 0.21 moves gate_proj/up_proj/down_proj onto the fused experts of the Qwen2-MoE-style models (DeepSeek-V3,
Qwen3-MoE, Qwen2-MoE) and leaves their dense MLPs and shared experts alone; Llama 4's and Mixtral's experts are
not adapted at all. The estimator must count (and allocate) exactly what peft builds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuready.memory.estimate import trainable_params
from gpuready.models.lora import default_lora_targets
from gpuready.models.spec import spec_from_config
from gpuready.workload import make_workload

BASE = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
CONFIGS = {
    "deepseek_v3": {**BASE, "model_type": "deepseek_v3", "num_key_value_heads": 4, "moe_intermediate_size": 32,
                    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
                    "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                    "v_head_dim": 8, "n_group": 1, "topk_group": 1},
    "qwen3_moe": {**BASE, "model_type": "qwen3_moe", "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "qwen2_moe": {**BASE, "model_type": "qwen2_moe", "num_key_value_heads": 4, "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64},
    "llama4_text": {**BASE, "model_type": "llama4_text", "intermediate_size": 32, "intermediate_size_mlp": 128,
                    "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 1,
                    "interleave_moe_layer_step": 2},
    "mixtral": {**BASE, "model_type": "mixtral", "num_key_value_heads": 2, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "llama": {**BASE, "model_type": "llama", "num_key_value_heads": 2},
}  # fmt: skip


def _peft_trainable(config: dict[str, object], targets: list[str]) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    cfg = dict(config)
    model_type = str(cfg.pop("model_type"))
    hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
        lora = peft.LoraConfig(r=8, lora_alpha=32, lora_dropout=0.0, target_modules=targets)
        model = peft.get_peft_model(model, lora)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.torch
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_lora_trainable_params_match_peft_for_the_default_targets(family: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS[family]), encoding="utf-8")
    w = make_workload(model=str(path), task="train", method="lora", lora_r=8, batch=1, seq=64)
    spec = spec_from_config(CONFIGS[family], str(path))
    assert trainable_params(spec, w) == _peft_trainable(CONFIGS[family], default_lora_targets(spec))


def test_deepseek_lora_adapts_the_fused_experts_not_the_dense_mlp_or_shared_experts(tmp_path: Path) -> None:
    from gpuready.memory.lm.context import experts_lora, lora_targets

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS["deepseek_v3"]), encoding="utf-8")
    spec = spec_from_config(CONFIGS["deepseek_v3"], str(path))
    w = make_workload(model=str(path), task="train", method="lora", lora_r=8, batch=1, seq=64)
    assert not any(name.split(".")[-1] in ("gate_proj", "up_proj", "down_proj") for name in lora_targets(spec, w))
    lora = experts_lora(spec, w)
    assert (lora.gate_up_rank, lora.down_rank) == (16, 8)  # gate and up fused: twice the rank
    # targeting attention only leaves the experts alone
    attn = make_workload(model=str(path), task="train", method="lora", lora_targets="q_b_proj,o_proj", seq=64)
    assert not experts_lora(spec, attn)
