"""Programs built with a layer's events written out again (memory/lm/memo.py) are the programs built layer by layer."""

from __future__ import annotations

from typing import Any

import pytest

from gpuready.errors import InputError
from gpuready.memory.estimate import _build
from gpuready.memory.lm import memo
from gpuready.memory.program import Program
from gpuready.models import resolve_model
from gpuready.workload import make_workload

MODELS = (
    "gpt2",
    "qwen2.5-0.5b",
    "qwen3-0.6b",
    "llama-3.2-1b",
    "gemma-2-2b",
    "gemma-3-1b",
    "pythia-410m",
    "phi-3-mini",
    "qwen1.5-moe-a2.7b",
    "deepseek-v2-lite",
    "gpt-oss-20b",
)
SHAPES: tuple[dict[str, Any], ...] = (
    {"method": "full"},
    {"method": "full", "grad_ckpt": True},
    {"method": "full", "precision": "mixed", "grad_ckpt": True},
    {"method": "full", "precision": "fp32"},
    {"method": "full", "grad_accum": 2},
    {"method": "lora"},
    {"method": "lora", "grad_ckpt": True},
    {"method": "lora", "grad_ckpt": True, "grad_accum": 3},
    {"method": "qlora", "grad_ckpt": True},
    {"method": "lora", "attn": "eager"},
    {"method": "full", "gpus": 2, "shard": "ddp", "grad_ckpt": True},
    {"method": "full", "gpus": 2, "shard": "fsdp"},
    {"task": "infer", "new_tokens": 16},
    {"task": "infer", "new_tokens": 0},
)


def _facts(prog: Program) -> tuple[Any, ...]:
    return (
        prog.events,
        prog.sizes,
        prog.categories,
        prog.allocated,
        prog.peak_allocated,
        prog.phase_peaks,
        prog.phase_peak_events,
        prog.largest_request,
        prog.phase,
    )


@pytest.mark.parametrize("model", MODELS)
def test_memoised_programs_are_the_programs_built_layer_by_layer(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = resolve_model(model)
    compared = 0
    for i, shape in enumerate(SHAPES):
        batch, seq = (1, 2)[i % 2], (256, 512)[i % 2]
        try:
            w = make_workload(model=model, batch=batch, seq=seq, **shape)
            monkeypatch.setattr(memo, "ENABLED", True)
            fast = _build(spec, w)
        except InputError:
            continue
        monkeypatch.setattr(memo, "ENABLED", False)
        plain = _build(spec, w)
        assert _facts(fast) == _facts(plain), (model, shape)
        compared += 1
    assert compared >= 8


def test_a_span_that_frees_what_it_was_not_given_is_not_recorded() -> None:
    spec = resolve_model("gpt2")
    w = make_workload(model="gpt2", batch=1, seq=128)
    from gpuready.memory.lm.context import make_ctx

    prog = Program()
    m = memo.SpanMemo(prog, make_ctx(spec, w))
    outside = prog.alloc("activations", 4096)

    def run() -> tuple[list[int], Any]:
        prog.free(outside)
        return [prog.alloc("activations", 8192)], None

    m.call("k", (), run)
    assert m.spans[("k", prog.phase)] is None
    calls = []

    def again() -> tuple[list[int], Any]:
        calls.append(1)
        return [prog.alloc("activations", 8192)], None

    m.call("k", (), again)
    assert calls == [1]  # run again, not written out


def test_a_written_out_span_renumbers_its_handles_and_its_inputs() -> None:
    spec = resolve_model("gpt2")
    from gpuready.memory.lm.context import make_ctx

    prog = Program()
    m = memo.SpanMemo(prog, make_ctx(spec, make_workload(model="gpt2", batch=1, seq=128)))

    def run_with(x: int) -> Any:
        def run() -> tuple[list[int], Any]:
            a = prog.alloc("activations", 1000)
            b = prog.alloc("activations", 3000)
            prog.free(a)
            prog.free(x)
            return [b, 0, x], "payload"

        return run

    x1 = prog.alloc("activations", 512)
    first = m.call("k", [x1], run_with(x1))
    x2 = prog.alloc("activations", 512)
    second = m.call("k", [x2], run_with(x2))
    assert first == ([3, 0, x1], "payload")
    assert second == ([6, 0, x2], "payload")
    assert prog.events == [512, 1024, 3072, -2, -1, 512, 1024, 3072, -5, -4]
    assert prog.allocated == 2 * 3072
    assert prog.peak_allocated == 3072 + 512 + 1024 + 3072  # the first span leaves b; x2 and the second span


@pytest.mark.parametrize("model", ["llama-3.2-1b", "gemma-2-2b", "qwen1.5-moe-a2.7b", "pythia-410m"])
def test_memoised_batch_templates_are_the_templates_recorded_layer_by_layer(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuready.memory.template import build_template

    spec = resolve_model(model)
    made = 0
    for shape in SHAPES:
        try:
            w = make_workload(model=model, batch=1, seq=256, **shape)
        except InputError:
            continue
        monkeypatch.setattr(memo, "ENABLED", True)
        fast = build_template(lambda v: _build(spec, v), w)
        monkeypatch.setattr(memo, "ENABLED", False)
        plain = build_template(lambda v: _build(spec, v), w)
        assert fast == plain, (model, shape)
        made += fast is not None
    assert made >= 5


def test_a_span_that_switches_phase_is_not_recorded() -> None:
    # a span's running totals are written out into one phase: a span that switches phase runs every time
    spec = resolve_model("gpt2")
    from gpuready.memory.lm.context import make_ctx

    prog = Program()
    m = memo.SpanMemo(prog, make_ctx(spec, make_workload(model="gpt2", batch=1, seq=128)))
    calls: list[int] = []

    def run() -> tuple[list[int], Any]:
        calls.append(1)
        prog.set_phase("forward")
        h = prog.alloc("activations", 4096)
        prog.set_phase("load")
        return [h], None

    m.call("k", (), run)
    m.call("k", (), run)
    assert calls == [1, 1]
    assert prog.phase_peaks["forward"] == 2 * 4096 and prog.phase == "load"  # both runs made their tensor
