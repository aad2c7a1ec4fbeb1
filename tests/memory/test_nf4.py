"""QLoRA's 4-bit layers (memory/lm/nf4.py) against the recorded H200 histories of the probe's QLoRA jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuready.memory.estimate import estimate
from gpuready.memory.history import history_streams, load_history
from gpuready.memory.lm import nf4
from gpuready.memory.program import Program, rounded
from gpuready.workload import make_workload

HISTORIES = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "histories"


def _events(prog: Program) -> list[tuple[bool, int]]:
    """(allocates, rounded bytes) for each event of `prog`."""
    return [(ev > 0, ev if ev > 0 else prog.sizes[-ev]) for ev in prog.events]


@pytest.fixture(scope="module")
def llama8b() -> list[tuple[bool, int]]:
    doc = load_history(HISTORIES / "qlora_llama8b_b1_s2048.json.gz")
    return [(e.alloc, rounded(e.nbytes)) for e in history_streams(doc, depth=1)[0]]


def test_loading_a_weight_makes_the_recorded_requests(llama8b: list[tuple[bool, int]]) -> None:
    # the history's first weight after the embedding: layer 0's q_proj (4096 x 4096), made in bf16 and quantized
    prog = Program()
    nf4.load(prog, 4096 * 4096, 2)
    assert _events(prog) == llama8b[1:22]
    kept = sum(prog.sizes[h] for h in range(1, len(prog.sizes))) - sum(prog.sizes[-ev] for ev in prog.events if ev < 0)
    # what stays is nf4.kept_bytes as the allocator rounds it (the scalars and tables take 512 B blocks)
    # (the packed codes, the 8-bit absmax, the NF4 table and the offset, two 256-entry tables, the nested absmax)
    assert kept == rounded(4096 * 4096 // 2) + rounded(4096 * 4096 // 64) + 2 * 512 + 2 * 1024 + 4096
    assert nf4.kept_bytes(4096 * 4096) == 4096 * 4096 // 2 + 4096 * 4096 // 64 + 4096 + 2 * 1024 + 64 + 4


def test_a_forward_matmul_dequantizes_as_recorded(llama8b: list[tuple[bool, int]]) -> None:
    # layer 0's q_proj forward at 2048 tokens: the absmax twice in fp32, the bf16 weight, the output, then they go
    prog = Program()
    nf4.forward_output(prog, 4096 * 4096, 2, 2048 * 4096 * 2)
    want = _events(prog)
    starts = [i for i in range(len(llama8b) - len(want)) if llama8b[i : i + len(want)] == want]
    assert starts, "the recorded history has no such run of requests"


def test_a_backward_input_gradient_dequantizes_as_recorded(llama8b: list[tuple[bool, int]]) -> None:
    # v_proj (4096 -> 1024) in backward: the absmax and the bf16 weight, the absmax freed, the input gradient made
    prog = Program()
    nf4.input_grad(prog, 4096 * 1024, 2, 2048 * 4096 * 2)
    want = _events(prog)
    assert any(llama8b[i : i + len(want)] == want for i in range(len(llama8b) - len(want)))


def test_qlora_weights_are_about_a_quarter_of_bf16() -> None:
    lora = estimate(make_workload(model="llama-3.1-8b", method="lora", batch=1, seq=64))
    qlora = estimate(make_workload(model="llama-3.1-8b", method="qlora", batch=1, seq=64))
    # the linear layers (6.98 B of 8.03 B parameters) go from 2 bytes to about 0.516; embeddings and head stay bf16
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    saved = lora.breakdown["weights"] - qlora.breakdown["weights"]
    assert saved == pytest.approx(linear * (2 - 0.516), rel=0.002)


def test_moe_experts_stay_in_bf16_under_qlora() -> None:
    # transformers 5 keeps routed experts as fused 3-D parameters, which bitsandbytes' 4-bit conversion skips: QLoRA
    # saves only on the attention and shared-expert linears (count 1)
    from gpuready.memory.lm.context import layer_linears
    from gpuready.models import resolve_model

    spec = resolve_model("qwen1.5-moe-a2.7b")
    lora = estimate(make_workload(model="qwen1.5-moe-a2.7b", method="lora", batch=1, seq=64))
    qlora = estimate(make_workload(model="qwen1.5-moe-a2.7b", method="qlora", batch=1, seq=64))
    dense = [
        lin.in_features * lin.out_features
        for layer in range(spec.layers)
        for lin in layer_linears(spec, layer)
        if lin.count == 1
    ]
    assert any(lin.count > 1 for lin in layer_linears(spec, 0))  # (the routed experts are there)
    saved = lora.breakdown["weights"] - qlora.breakdown["weights"]
    assert saved == pytest.approx(sum(2 * n - nf4.kept_bytes(n) for n in dense), rel=0.01)
