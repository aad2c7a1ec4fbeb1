"""memory/sweep.py: a batch sweep gives estimate()'s answers, in order, from several threads."""

from __future__ import annotations

import importlib
import threading
from typing import Any

import pytest

from gpuready.errors import InputError
from gpuready.memory import estimate
from gpuready.memory.sweep import default_workers, estimate_batches
from gpuready.workload import make_workload

GIB = 1 << 30
est_module = importlib.import_module("gpuready.memory.estimate")
sweep_module = importlib.import_module("gpuready.memory.sweep")


@pytest.mark.parametrize(
    ("fields", "card"),
    [
        ({"model": "gpt2", "method": "lora", "seq": 256}, None),
        ({"model": "qwen2.5-0.5b", "method": "full", "seq": 512, "grad_ckpt": True}, 24 * GIB),
        ({"model": "resnet50", "precision": "bf16"}, 16 * GIB),
        ({"model": "llama-3.2-1b", "task": "infer", "seq": 256, "new_tokens": 32}, 24 * GIB),
        # a template from 128 rows and one below it (sampling's sort paths), both recorded before the threads
        ({"model": "qwen2.5-0.5b", "task": "infer", "seq": 64, "new_tokens": 4, "decoding": "sample"}, 16 * GIB),
    ],
)
def test_each_batch_equals_its_own_estimate(fields: dict[str, Any], card: int | None) -> None:
    batches = [3, 1, 8, 2, 5, 5, 13]
    est_module.clear_caches()
    swept = estimate_batches(make_workload(**fields), batches, card, find_max_batch=card is not None, workers=3)
    est_module.clear_caches()
    alone = [estimate(make_workload(**fields, batch=b), card, find_max_batch=card is not None) for b in batches]
    assert swept == alone
    assert [r.peak_reserved_bytes for r in swept[:2]] != [0, 0]
    if card is not None:
        assert all(r.fits is not None and r.max_batch is not None for r in swept)


def test_batches_after_the_first_two_run_on_several_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[int, int] = {}
    real = sweep_module.estimate
    barrier = threading.Barrier(2, timeout=10)

    def spy(w: Any, *args: Any, **kwargs: Any) -> Any:
        seen[w.batch] = threading.get_ident()
        if w.batch in (3, 4):  # the first batch of each of the two threads: both must be running at once
            barrier.wait()
        return real(w, *args, **kwargs)

    monkeypatch.setattr(sweep_module, "estimate", spy)
    out = estimate_batches(make_workload(model="gpt2", seq=128), [1, 2, 3, 4, 5, 6], workers=2)
    assert [r.peak_reserved_bytes > 0 for r in out] == [True] * 6
    assert seen[1] == seen[2] == threading.get_ident()
    assert seen[3] != seen[4]
    assert {seen[3], seen[4]} == {seen[5], seen[6]}


def test_one_worker_and_many_agree() -> None:
    w = make_workload(model="gpt2", method="lora", seq=256)
    one = estimate_batches(w, range(1, 12), workers=1)
    est_module.clear_caches()
    many = estimate_batches(w, range(1, 12), workers=4)
    assert one == many
    assert [r.peak_reserved_bytes for r in one] == sorted(r.peak_reserved_bytes for r in one)


def test_an_error_in_a_thread_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    real = sweep_module.estimate

    def failing(w: Any, *args: Any, **kwargs: Any) -> Any:
        if w.batch == 7:
            raise RuntimeError("batch 7 broke")
        return real(w, *args, **kwargs)

    monkeypatch.setattr(sweep_module, "estimate", failing)
    with pytest.raises(RuntimeError, match="batch 7 broke"):
        estimate_batches(make_workload(model="gpt2", seq=128), range(1, 10), workers=3)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_a_bad_batch_is_an_input_error_naming_the_field(bad: Any) -> None:
    with pytest.raises(InputError) as err:
        estimate_batches(make_workload(model="gpt2"), [1, bad])
    assert err.value.field == "batch"


def test_workers_must_be_positive_and_default_to_the_cores() -> None:
    with pytest.raises(InputError) as err:
        estimate_batches(make_workload(model="gpt2"), [1, 2, 3], workers=0)
    assert err.value.field == "workers"
    assert 1 <= default_workers() <= sweep_module.MAX_WORKERS


def test_an_empty_sweep_is_empty() -> None:
    assert estimate_batches(make_workload(model="gpt2"), []) == []


def test_a_sweep_of_another_variable_keeps_the_rest_of_the_job() -> None:
    from gpuready.memory import estimate_sweep

    base = make_workload(model="qwen2.5-0.5b", method="lora", grad_ckpt=True, batch=2, seq=512)
    swept = estimate_sweep(base, "lora_r", [8, 64], 24 * GIB, find_max_batch=True)
    alone = [estimate(base.model_copy(update={"lora_r": r}), 24 * GIB) for r in (8, 64)]
    assert swept == alone
    assert swept[0].trainable_params < swept[1].trainable_params
    with pytest.raises(InputError) as err:
        estimate_sweep(base, "hidden_size", [1])
    assert err.value.field == "--sweep"


@pytest.mark.parametrize(
    ("fields", "variable", "word"),
    [
        ({"model": "gpt2"}, "image_size", "sizes vision models"),
        ({"model": "resnet50"}, "seq", "image_size"),
        ({"model": "gpt2"}, "new_tokens", "--task infer"),
        ({"model": "gpt2"}, "lora_r", "--method lora"),
        ({"model": "gpt2", "task": "infer"}, "grad_accum", "training"),
    ],
)
def test_a_variable_that_does_not_change_the_job_is_refused(fields: dict[str, Any], variable: str, word: str) -> None:
    from gpuready.memory import estimate_sweep

    with pytest.raises(InputError) as err:
        estimate_sweep(make_workload(**fields), variable, [1, 2])
    assert err.value.field == "--sweep" and word in err.value.message


def test_each_swept_value_is_read_against_the_model_as_a_flag_is() -> None:
    from gpuready.memory.sweep import checked_sweep

    # gpt2 learns 1024 positions: a longer sequence is refused as `--seq 4096` is
    with pytest.raises(InputError) as err:
        checked_sweep(make_workload(model="gpt2", seq=512), "seq", [512, 4096])
    assert err.value.field == "--seq"
    # past a RoPE model's trained context: sized, with the warning the flag would give
    checked = checked_sweep(make_workload(model="llama-3.2-1b"), "seq", [1024, 200_000])
    assert not checked[0].warnings and any("trained context" in w for w in checked[1].warnings)
    assert [c.workload.seq for c in checked] == [1024, 200_000]


@pytest.mark.parametrize(
    "fields",
    [
        {"model": "qwen2.5-0.5b", "method": "lora", "seq": 1024, "batch": 4},
        {"model": "llama-3.2-1b", "task": "infer", "seq": 512, "new_tokens": 16, "batch": 8},
    ],
)
def test_every_card_estimated_on_threads_equals_its_own_estimate(fields: dict[str, Any]) -> None:
    from gpuready.memory.sweep import estimate_cards

    cards = [24 * GIB, 8 * GIB, 24 * GIB, 3 * GIB, 80 * GIB, 5 * GIB]
    est_module.clear_caches()
    threaded = estimate_cards(make_workload(**fields), cards, workers=3)
    est_module.clear_caches()
    alone = {c: estimate(make_workload(**fields), c) for c in cards}
    assert list(threaded) == [24 * GIB, 8 * GIB, 3 * GIB, 80 * GIB, 5 * GIB]  # each card once, in the order given
    assert threaded == alone
    verdicts = {c: (e.fits, e.max_batch) for c, e in threaded.items()}
    assert verdicts[80 * GIB][0] and not verdicts[3 * GIB][0]  # both answers among the cards
    assert len({v[1] for v in verdicts.values()}) > 2  # the max batch differs card by card


def test_threads_asking_for_the_same_job_replay_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan's cards on threads ask for the same batches: the second thread waits for the first's replay."""
    est = importlib.import_module("gpuready.memory.estimate")
    est.clear_caches()
    real = est._run
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def slow(spec: Any, w: Any, meta_init: bool = False) -> Any:
        calls.append(w.batch)
        started.set()
        assert release.wait(10)
        return real(spec, w, meta_init)

    monkeypatch.setattr(est, "_run", slow)
    w = make_workload(model="gpt2", seq=128, batch=3)
    spec = est.resolve_model(w.model)
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(est._core(spec, w))) for _ in range(2)]
    threads[0].start()
    assert started.wait(10)
    threads[1].start()
    release.set()
    for t in threads:
        t.join(10)
    assert calls == [3]
    assert len(results) == 2 and results[0] is results[1]
    assert not est._core_running
    est.clear_caches()


def test_plan_times_the_cards_in_its_own_thread_while_the_replays_run() -> None:
    """estimate_cards' `meanwhile` runs once, in the calling thread, on threads or not; its error reaches the caller."""
    from gpuready.memory.sweep import estimate_cards

    w = make_workload(model="gpt2", seq=128)
    ran: list[int] = []
    for workers in (1, 2):
        out = estimate_cards(
            w, [8 << 30, 16 << 30], workers=workers, meanwhile=lambda: ran.append(threading.get_ident())
        )
        assert sorted(out) == [8 << 30, 16 << 30]
    assert ran == [threading.get_ident()] * 2

    def broken() -> None:
        raise ValueError("meanwhile failed")

    with pytest.raises(ValueError, match="meanwhile failed"):
        estimate_cards(w, [8 << 30, 16 << 30, 24 << 30], workers=2, meanwhile=broken)
