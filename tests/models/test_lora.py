"""models/lora.py: the layers LoRA adapts by default are the model's own block linears, as peft names them."""

from __future__ import annotations

from gpuready.memory.lm.context import lora_targets
from gpuready.models import resolve_model
from gpuready.models.lora import default_lora_targets
from gpuready.workload import Workload


def test_default_lora_targets_are_every_block_linear_by_its_last_name_part() -> None:
    assert default_lora_targets(resolve_model("llama-3.2-1b")) == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    # phi-3 fuses q/k/v and gate/up; gpt2's two c_proj are one name to peft
    assert default_lora_targets(resolve_model("phi-3-mini")) == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    assert default_lora_targets(resolve_model("gpt2")) == ["c_attn", "c_proj", "c_fc"]


def test_default_lora_targets_adapt_every_single_block_linear_in_the_estimator() -> None:
    for name in ("llama-3.2-1b", "phi-3-mini", "gpt2", "qwen3-0.6b"):
        spec = resolve_model(name)
        w = Workload(model=name, method="lora")
        single = {lin.name for lin in spec.block_linears if lin.count == 1}
        assert lora_targets(spec, w) == single, name
