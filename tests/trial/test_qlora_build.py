"""trial/qlora.py's 4-bit model from a config, on the CPU with bitsandbytes faked (the real run is on the H200:
docs/calibration/h200_heldout12_a.jsonl and the histories qlora_*.json.gz)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from gpuready.trial.qlora import build_from_config  # noqa: E402


def fake_bnb(quantized: list[tuple[int, ...]]) -> Any:
    """Linear4bit and Params4bit with bitsandbytes' signatures: quantizing packs the weight into n/2 bytes and
    records the weight's shape."""

    class Linear4bit(torch.nn.Linear):  # type: ignore[misc]
        def __init__(self, fan_in: int, fan_out: int, bias: bool = True, device: Any = None, **kwargs: Any) -> None:
            super().__init__(fan_in, fan_out, bias, device=device)
            self.kwargs = kwargs

    class Params4bit(torch.nn.Parameter):  # type: ignore[misc]
        def __new__(cls, data: Any, requires_grad: bool = False, module: Any = None, **kwargs: Any) -> Any:
            return super().__new__(cls, data, requires_grad)

        def _quantize(self, device: Any) -> Any:
            quantized.append(tuple(self.data.shape))
            self.data = torch.empty(self.data.numel() // 2, 1, dtype=torch.uint8, device=device)
            return self

    return SimpleNamespace(nn=SimpleNamespace(Linear4bit=Linear4bit, Params4bit=Params4bit))


def tiny_llama(tied: bool) -> Any:
    return transformers.AutoConfig.for_model(
        "llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        tie_word_embeddings=tied,
    )


@pytest.mark.parametrize("tied", [True, False])
def test_every_linear_but_the_head_is_4_bit_and_quantized_in_module_order(tied: bool) -> None:
    quantized: list[tuple[int, ...]] = []
    bnb = fake_bnb(quantized)
    model = build_from_config(torch, tiny_llama(tied), torch.bfloat16, "sdpa", device=torch.device("cpu"), bnb=bnb)
    four_bit = [n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(four_bit) == 2 * 7 and not any(n.endswith("lm_head") for n in four_bit)
    assert type(model.lm_head) is torch.nn.Linear
    # each weight made in bf16 and quantized at once, layer 0's q, k, v, o, gate, up, down first
    assert quantized[:7] == [(64, 64), (32, 64), (32, 64), (64, 64), (128, 64), (128, 64), (64, 128)]
    assert len(quantized) == 14
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(b.device.type == "cpu" for b in model.buffers())  # (the rotary tables: real, moved)
    embed = model.get_input_embeddings().weight
    assert embed.dtype == torch.bfloat16
    # a tied head is the embedding itself (made once, as from_pretrained ties it), an untied one its own tensor
    assert (model.lm_head.weight is embed) is tied
