"""The batch template (memory/template.py): the program written out for a batch is the one the builders make for
it, and any use of the batch that is not the same for every batch gives no template (the program is then built)."""

from __future__ import annotations

import pytest

from gpuready.memory.estimate import _build, _template, clear_caches, estimate, template_for
from gpuready.memory.program import Program
from gpuready.memory.template import Batch, NotAffine, build_template
from gpuready.models import resolve_model
from gpuready.workload import Workload, make_workload

GIB = 2**30


@pytest.mark.parametrize(
    "fields",
    [
        {"model": "gpt2", "method": "lora", "seq": 256},
        {"model": "qwen2.5-0.5b", "seq": 512, "grad_ckpt": True, "precision": "mixed"},
        {"model": "llama-3.2-1b", "task": "infer", "seq": 256, "new_tokens": 20},
        {"model": "smollm2-135m", "seq": 256, "gpus": 2, "shard": "fsdp"},
    ],
)
def test_the_written_out_program_is_the_built_one_at_every_batch(fields: dict[str, object]) -> None:
    w = make_workload(**fields)
    spec = resolve_model(w.model)
    template = build_template(lambda x: _build(spec, x), w)
    assert template is not None
    for batch in (1, 2, 3, 7, 100):
        assert template.instantiate(batch) == _build(spec, w.model_copy(update={"batch": batch}))


def _branchy(w: Workload) -> Program:
    prog = Program()
    prog.alloc("activations", w.batch * 1000)
    if w.batch > 4:  # a branch on the batch: not the same program at every batch
        prog.alloc("activations", 10)
    return prog


def _rounding_read_back(w: Workload) -> Program:
    prog = Program()
    h = prog.alloc("activations", w.batch * 1000)
    prog.alloc("activations", prog.size_of(h) * 2)  # the rounded size is not affine in the batch
    return prog


def _float_product(w: Workload) -> Program:
    prog = Program()
    prog.alloc("activations", int(w.batch * 1.5))
    return prog


def _running_total_read_back(w: Workload) -> Program:
    prog = Program()
    prog.alloc("activations", w.batch * 1000)
    if prog.allocated > 10_000:  # depends on the batch through the running total
        prog.alloc("activations", 10)
    return prog


@pytest.mark.parametrize("build", [_branchy, _rounding_read_back, _float_product, _running_total_read_back])
def test_a_use_of_the_batch_that_differs_between_batches_gives_no_template(build: object) -> None:
    assert build_template(build, make_workload(model="gpt2")) is None  # type: ignore[arg-type]


def test_batch_comparisons_answer_only_when_the_answer_is_the_same_for_every_batch() -> None:
    b = Batch()
    assert b * 4 > 0 and b >= 1 and b + 1 > b and b * 2 != b
    assert (b * 2048 == b) is False  # never equal for a batch of 1 or more
    with pytest.raises(NotAffine):
        _ = b > 4
    with pytest.raises(NotAffine):
        _ = b * 3 // 2
    assert (b * 4 + 8) // 4 == b + 2


def test_estimates_from_the_template_equal_those_built_batch_by_batch() -> None:
    w = make_workload(model="qwen2.5-0.5b", method="lora", seq=512)
    clear_caches()
    built = [estimate(w.model_copy(update={"batch": b}), 8 * GIB) for b in (3, 5)]
    clear_caches()
    estimate(w, 8 * GIB)  # batch 1 first: the batches after it come from the template
    written = [estimate(w.model_copy(update={"batch": b}), 8 * GIB) for b in (3, 5)]
    assert _template.cache_info().currsize == 1
    assert written == built


def test_an_equality_that_holds_at_one_batch_only_gives_no_answer() -> None:
    b = Batch()
    assert b * 2 + 1 != b * 2  # never equal
    assert (b * 2 == 3) is False  # 2b = 3 has no whole batch
    with pytest.raises(NotAffine):
        _ = b * 2 == 8  # batch 4
    with pytest.raises(NotAffine):
        bool(b - 1)  # zero at batch 1


def test_programs_built_in_another_thread_while_recording_stay_plain() -> None:
    import threading

    from gpuready.memory.template import _recording

    seen: list[list[int]] = []

    def other() -> None:
        prog = Program()
        prog.free(prog.alloc("activations", 1000))
        seen.append(prog.events)

    with _recording() as made:
        Program()  # this thread's program is recorded
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(made) == 1
    assert seen == [[1024, -1]]


def test_a_kbit_prep_template_writes_out_peft_s_empty_cache() -> None:
    # peft's prepare_model_for_kbit_training calls torch.cuda.empty_cache() after its fp32 casts (histories kbit_*):
    # the program's event 0, which the batch template must write out at every batch as the builders make it
    from gpuready.memory.estimate import _build
    from gpuready.memory.template import build_template
    from gpuready.models import resolve_model
    from gpuready.workload import make_workload

    spec = resolve_model("qwen2.5-3b")
    w = make_workload(model="qwen2.5-3b", method="qlora", autocast=True, kbit_prep=True, seq=512, grad_ckpt=True)
    built = _build(spec, w)
    assert list(built.events).count(0) == 1
    template = build_template(lambda x: _build(spec, x), w)
    assert template is not None
    for batch in (1, 3, 8):
        made = template.instantiate(batch)
        assert made == _build(spec, w.model_copy(update={"batch": batch}))
        assert list(made.events).count(0) == 1
    peak_phase = max(built.phase_peaks, key=lambda p: built.phase_peaks[p])
    assert sum(built.breakdown(peak_phase).values()) == built.peak_allocated  # (event 0 frees nothing)


def test_a_size_known_per_batch_holds_from_the_first_batch_it_exists() -> None:
    # the final norm's weight gradient reduction (ops.reduce_buffer_bytes) at 256 tokens: no staging buffer at batch 1
    # (too few rows per thread), one from a few batches up; the template holds from there, and estimate() builds the
    # batches below it
    w = make_workload(model="qwen3-0.6b", method="full", seq=256)
    spec = resolve_model(w.model)
    template = build_template(lambda x: _build(spec, x), w)
    assert template is not None and template.per_batch
    assert 1 < template.min_batch < 64
    with pytest.raises(ValueError, match="holds from batch"):
        template.instantiate(template.min_batch - 1)
    for batch in (template.min_batch, template.min_batch + 1, 64, 1000):
        assert template.instantiate(batch) == _build(spec, w.model_copy(update={"batch": batch}))
    clear_caches()
    swept = [estimate(w.model_copy(update={"batch": b})) for b in range(1, template.min_batch + 2)]
    for b, got in enumerate(swept, start=1):
        clear_caches()
        assert estimate(w.model_copy(update={"batch": b})) == got


def test_a_size_known_per_batch_in_a_memoised_layer_is_worked_out_in_every_layer() -> None:
    # GPT-2's Conv1D bias gradients take a reduction buffer in every layer's backward; the layer memo writes the
    # first layer's span out for the others, and each copy must carry the size as a function of the batch (written
    # out at the recording's first batch instead, batch 13 came out with 6 MiB buffers for 39 MiB ones)
    w = make_workload(model="gpt2", method="full", seq=512)
    spec = resolve_model(w.model)
    template = build_template(lambda x: _build(spec, x), w)
    assert template is not None and len(template.per_batch) >= 4 * spec.layers
    for batch in (template.min_batch, 13, 100):
        assert template.instantiate(batch) == _build(spec, w.model_copy(update={"batch": batch}))


def test_a_program_that_differs_below_a_batch_takes_a_template_from_there() -> None:
    # eager attention copies its operands only past one sequence (Program.from_batch): the template holds from batch
    # 2, where it writes out what the builders make; batch 1 is built (and has no copies)
    w = make_workload(model="llama-3.2-1b", method="lora", seq=512, attn="eager")
    spec = resolve_model(w.model)
    template = build_template(lambda x: _build(spec, x), w)
    assert template is not None and template.min_batch == 2
    for batch in (2, 3, 16):
        assert template.instantiate(batch) == _build(spec, w.model_copy(update={"batch": batch}))
    assert Program().from_batch(1, 2) is False and Program().from_batch(2, 2) is True


def test_the_batches_below_a_template_s_first_take_a_template_of_their_own() -> None:
    # sampling's torch.sort takes another path from 128 rows and another below it (lm/sampling.sort_scratch): the
    # structure's template holds from 128; the template below it, recorded over batches 1-127 only, from 2
    w = make_workload(model="qwen2.5-0.5b", task="infer", seq=64, new_tokens=5, decoding="sample")
    spec = resolve_model(w.model)
    template = build_template(lambda x: _build(spec, x), w)
    assert template is not None and (template.min_batch, template.max_batch) == (128, 1_000_000)
    lower = build_template(lambda x: _build(spec, x), w, below=template.min_batch)
    assert lower is not None and (lower.min_batch, lower.max_batch) == (2, 127)
    for batch, writer in ((2, lower), (37, lower), (127, lower), (128, template), (300, template)):
        assert writer.instantiate(batch) == _build(spec, w.model_copy(update={"batch": batch}))
    with pytest.raises(ValueError, match="from batch 2 to 127"):
        lower.instantiate(128)
    structure = w.model_copy(update={"batch": 1})
    assert template_for(spec, structure, False, 50) is template_for(spec, structure, False, 2)
    assert template_for(spec, structure, False, 1) is None  # batch 1 is built
