"""The compiled replay (memory/_replay.c via memory/native.py) against the Python loop it stands in for."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuready.memory import allocator, native
from gpuready.memory.allocator import _replay_one_stream, replay, replay_reference

MIB = 1 << 20


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUREADY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUREADY_NATIVE", raising=False)
    native.reset()
    yield tmp_path / "cache"
    native.reset()


def _compiled(cache: Path) -> native.NativeReplay:
    fn = native.replay_function()
    if fn is None:
        pytest.skip("no C compiler on this machine: the Python loop runs instead")
    return fn


def _trace(rng: random.Random, n: int) -> list[int]:
    """Allocations of every size class (small pool, large under 10 MiB, own segments) and frees in random order."""
    live: list[int] = []
    events: list[int] = []
    made = 0
    for _ in range(n):
        if rng.random() < 0.01:
            events.append(0)  # torch.cuda.empty_cache()
            continue
        if live and rng.random() < 0.45:
            events.append(-live.pop(rng.randrange(len(live))))
            continue
        kind = rng.random()
        if kind < 0.3:
            size = rng.randint(1, MIB)
        elif kind < 0.6:
            size = rng.randint(MIB + 1, 10 * MIB)
        else:
            size = rng.choice([16, 40, 86, 160, 240]) * MIB + rng.choice([0, 512, 4096])
        events.append(size)
        made += 1
        live.append(made)
    return events


def test_compiled_replay_gives_every_stat_of_the_python_loop_with_and_without_a_limit(cache: Path) -> None:
    _compiled(cache)
    rng = random.Random(7)
    for _ in range(60):
        events = _trace(rng, 800)
        peak = _replay_one_stream(events, None).peak_reserved_bytes
        for cap in (None, 0, peak // 3, peak // 2, peak * 3 // 4, peak * 9 // 10, peak - MIB, peak):
            assert replay(events, cap) == _replay_one_stream(events, cap) == replay_reference(events, cap)


def test_compiled_replay_matches_on_a_real_training_program(cache: Path) -> None:
    _compiled(cache)
    from gpuready.memory.estimate import _build
    from gpuready.models import resolve_model
    from gpuready.workload import make_workload

    w = make_workload(model="qwen2.5-0.5b", method="lora", grad_ckpt=True, seq=512, batch=2)
    events = _build(resolve_model(w.model), w).events
    peak = _replay_one_stream(events, None).peak_reserved_bytes
    for cap in (None, peak * 3 // 4, peak * 9 // 10, peak):
        assert replay(events, cap) == _replay_one_stream(events, cap)


def test_compiled_replay_refuses_a_double_free_and_an_unknown_id(cache: Path) -> None:
    _compiled(cache)
    with pytest.raises(ValueError, match="event 2: allocation 1 freed twice"):
        replay([1000, -1, -1])
    with pytest.raises(ValueError, match="allocation 5 freed before it was allocated"):
        replay([1000, -5])


def test_empty_and_zero_byte_events_are_no_allocations(cache: Path) -> None:
    _compiled(cache)
    assert replay([]) == _replay_one_stream([], None)
    assert replay([0, 0]) == _replay_one_stream([0, 0], None)


def test_native_off_runs_the_python_loop(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUREADY_NATIVE", "0")
    native.reset()
    assert native.replay_function() is None
    assert replay([2 * MIB, 100, -1]).peak_reserved_bytes == 22 * MIB
    assert not list(cache.glob("**/*.so"))


def test_no_compiler_falls_back_to_the_python_loop(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_compiler", lambda: None)
    assert native.replay_function() is None
    events = _trace(random.Random(3), 300)
    assert replay(events) == replay_reference(events)


def test_a_compiler_that_fails_leaves_no_library_and_falls_back(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "false")  # exits 1 for any arguments
    monkeypatch.setattr(native, "_compiler", lambda: "false")
    assert native.build() is None
    assert native.replay_function() is None
    assert not list(cache.glob("**/*.so"))
    assert not list(cache.glob("**/.replay-*"))  # the temporary file is removed


def test_a_damaged_cached_library_is_built_again(cache: Path, tmp_path: Path) -> None:
    if native._compiler() is None:
        pytest.skip("no C compiler on this machine")
    # a fresh process (this one may have the library loaded already, and would be handed that again)
    fresh = tmp_path / "fresh"
    path = fresh / "native" / native.library_path(native.SOURCE.read_bytes()).name
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared library")
    code = (
        "from gpuready.memory import native, allocator; "
        "assert native.replay_function() is not None; "
        "print(allocator.replay([3 * 2**20, -1]).peak_reserved_bytes)"
    )
    env = {**os.environ, "GPUREADY_CACHE": str(fresh)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(20 * MIB)
    assert path.read_bytes()[:4] == b"\x7fELF"


def test_a_changed_source_gets_its_own_library(cache: Path, tmp_path: Path) -> None:
    _compiled(cache)
    changed = tmp_path / "_replay.c"
    changed.write_bytes(native.SOURCE.read_bytes() + b"\n/* changed */\n")
    built = native.build(changed)
    assert built is not None and built != native.library_path(native.SOURCE.read_bytes())


def test_concurrent_first_uses_build_one_working_library(cache: Path) -> None:
    if native._compiler() is None:
        pytest.skip("no C compiler on this machine")
    results: list[Path | None] = []
    threads = [threading.Thread(target=lambda: results.append(native.build())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and results[0] is not None
    assert [p.name for p in cache.glob("native/*")] == [results[0].name]  # no temporary left behind
    fn = native.replay_function()
    assert fn is not None and allocator.replay([1000, -1]).peak_reserved_bytes == 2 * MIB


def _jobs() -> list[Any]:
    from gpuready.workload import make_workload

    return [
        make_workload(model="qwen2.5-0.5b", method="lora", grad_ckpt=True, seq=512, batch=1),
        make_workload(model="llama-3.2-1b", method="full", precision="mixed", seq=256, batch=1),
        make_workload(model="gpt2", task="infer", new_tokens=8, seq=128, batch=1),
        make_workload(model="qwen3-0.6b", method="full", grad_accum=2, seq=256, batch=1),
    ]


def test_compiled_template_instantiation_is_the_python_loop_field_for_field(cache: Path) -> None:
    _compiled(cache)
    from gpuready.memory.estimate import _build
    from gpuready.memory.template import build_template
    from gpuready.models import resolve_model

    for w in _jobs():
        spec = resolve_model(w.model)
        template = build_template(lambda v, spec=spec: _build(spec, v), w)
        assert template is not None, w
        for batch in (1, 2, 7, 64):
            fast, slow = template.instantiate(batch), template._instantiate_python(batch)
            assert fast == slow
            # the dicts list the phases in the same order (the first-listed wins a tie in estimate's max)
            assert list(fast.phase_peaks.items()) == list(slow.phase_peaks.items())
            assert list(fast.phase_peak_events.items()) == list(slow.phase_peak_events.items())
            assert fast.phase == slow.phase
            assert (fast.largest_request, fast.allocated) == (slow.largest_request, slow.allocated)


def test_compiled_breakdown_is_the_python_loop_in_the_same_order(cache: Path) -> None:
    _compiled(cache)
    from gpuready.memory.estimate import _build
    from gpuready.models import resolve_model

    for w in _jobs():
        prog = _build(resolve_model(w.model), w)
        for phase in prog.phase_peaks:
            end = prog.phase_peak_events[phase]
            assert list(prog.breakdown(phase).items()) == list(prog._breakdown_python(end).items())


def test_empty_cache_gives_wholly_free_segments_back_in_every_replay(cache: Path) -> None:
    _compiled(cache)
    # 30 MiB (its own segment) and 8 MiB (a 20 MiB segment) made, the 30 MiB one freed; empty_cache gives its
    # segment back, so the 25 MiB request takes a new 26 MiB segment instead of the cached 30 MiB block
    events = [30 * MIB, 8 * MIB, -1, 0, 25 * MIB]
    kept = [30 * MIB, 8 * MIB, -1, 25 * MIB]
    for run in (replay, _replay_one_stream, replay_reference):
        emptied, cached = run(events, None), run(kept, None)
        assert emptied.reserved_bytes == (20 + 26) * MIB and cached.reserved_bytes == 50 * MIB
        assert emptied.peak_reserved_bytes == cached.peak_reserved_bytes == 50 * MIB
        assert emptied.releases == 0 and emptied.segments == 2  # asked for, not forced by a limit
    # under a limit the emptied cache leaves room: 46 MiB fits a 48 MiB limit with no forced release
    assert replay(events, 48 * MIB) == _replay_one_stream(events, 48 * MIB) == replay_reference(events, 48 * MIB)
