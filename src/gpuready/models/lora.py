"""Which of a model's layers LoRA adapts by default (docs/cli.md's default for --lora-targets)."""

from __future__ import annotations

from gpuready.models.spec import ModelSpec


def default_lora_targets(spec: ModelSpec) -> list[str]:
    """Every linear layer of the blocks, named as peft matches them (by the module name's last part):
    q,k,v,o,gate,up,down_proj for llama/qwen/mistral/gemma; the fused qkv_proj and gate_up_proj for phi-3; c_attn,
    c_proj, c_fc for gpt2. The estimator, the trial and the traced mode use the same list."""
    return list(dict.fromkeys(lin.name.split(".")[-1] for lin in spec.block_linears))
