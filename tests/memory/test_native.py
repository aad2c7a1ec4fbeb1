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
        for batch in (b for b in (1, 2, 7, 64) if b >= template.min_batch):
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


def _stepped(rng: random.Random, steps: int = 3) -> tuple[list[int], list[int]]:
    """A training-like program: weights loaded, then `steps` steps of one random pattern (the first also makes
    optimizer-like states kept to the end); a few tensors of each step live into the next (as peft's held input).
    Returns the events and each step's first event."""
    events: list[int] = []
    made = 0

    def alloc(size: int) -> int:
        nonlocal made
        events.append(size)
        made += 1
        return made

    for _ in range(rng.randint(3, 30)):
        alloc(rng.choice([rng.randint(1, MIB), rng.randint(MIB + 1, 12 * MIB), rng.choice([24, 64, 130]) * MIB]))
    pattern: list[tuple[str, int]] = []  # ("a", size) allocates; ("f", k) frees the step's k-th allocation
    open_: list[int] = []
    count = 0
    for _ in range(rng.randint(10, 120)):
        if open_ and rng.random() < 0.45:
            pattern.append(("f", open_.pop(rng.randrange(len(open_)))))
        else:
            size = rng.choice([rng.randint(1, MIB), rng.randint(MIB + 1, 10 * MIB), rng.choice([16, 40, 86]) * MIB])
            pattern.append(("a", size))
            open_.append(count)
            count += 1
    held = open_[: rng.randint(0, min(2, len(open_)))]  # live into the next step, freed at its start
    for k in open_:
        if k not in held:
            pattern.append(("f", k))
    starts: list[int] = []
    carried: list[int] = []
    for step in range(steps):
        starts.append(len(events))
        for h in carried:
            events.append(-h)
        if step == 0:
            for _ in range(rng.randint(0, 4)):
                alloc(rng.choice([rng.randint(1, MIB), 20 * MIB]))  # the states, made in the first step
        ids: dict[int, int] = {}
        for op, x in pattern:
            if op == "a":
                ids[len(ids)] = alloc(x)
            else:
                events.append(-ids[x])
        carried = [ids[k] for k in held]
    return events, starts


def _stats(fn: native.NativeReplay, events: list[int], cap: int | None, repeat: tuple[int, int] | None) -> Any:
    rc, out = fn(events, -1 if cap is None else cap, repeat)
    return rc, out[:9], out[10]


def test_a_repeated_last_step_is_left_out_only_where_it_changes_nothing(cache: Path) -> None:
    fn = _compiled(cache)
    rng = random.Random(11)
    left_out = checked = 0
    for _ in range(300):
        events, starts = _stepped(rng)
        repeat = (starts[1], starts[2])
        if starts[2] - starts[1] != len(events) - starts[2]:
            continue  # (the first step's states make it longer; the last two are always the same length)
        peak = _replay_one_stream(events, None).peak_reserved_bytes
        for cap in (None, peak // 2, peak * 3 // 4, peak * 9 // 10, peak - MIB, peak):
            rc, stats, skipped = _stats(fn, events, cap, repeat)
            rc0, plain, none = _stats(fn, events, cap, None)
            assert (rc, stats) == (rc0, plain) and none == 0
            assert (
                replay(events, cap, repeat=repeat) == _replay_one_stream(events, cap) == replay_reference(events, cap)
            )
            checked += 1
            left_out += skipped > 0
            assert skipped in (0, len(events) - starts[2])
    assert checked > 1000 and left_out > checked // 4  # the check does let the common case through


def test_a_wrong_repeat_hint_changes_no_figure(cache: Path) -> None:
    _compiled(cache)
    rng = random.Random(5)
    tried = 0
    for _ in range(200):
        events, starts = _stepped(rng)
        a, b = starts[1], starts[2]
        if b - a != len(events) - b:
            continue
        bad = list(events)
        k = b + rng.randrange(len(events) - b)
        if bad[k] > 0:
            bad[k] += rng.choice([512, MIB, -min(bad[k] - 1, 512)])  # a size that differs, or rounds the same
        else:
            bad[k] = -rng.randint(1, sum(e > 0 for e in bad[:k]))  # another id freed (it may be freed twice)
        for evs, hint in ((bad, (a, b)), (events, (a - 1, b)), (events, (0, len(events) // 2)), (events, (b, a))):
            for cap in (None, _replay_one_stream(events, None).peak_reserved_bytes * 3 // 4):
                try:
                    want = _replay_one_stream(evs, cap)
                except ValueError as exc:
                    with pytest.raises(ValueError, match=str(exc).split(":")[0]):
                        replay(evs, cap, repeat=hint)
                    continue
                assert replay(evs, cap, repeat=hint) == want
                tried += 1
    assert tried > 300


def test_a_program_marks_its_steps_and_the_hint_is_used_by_estimate(cache: Path) -> None:
    fn = _compiled(cache)
    from gpuready.memory.estimate import _build
    from gpuready.models import resolve_model
    from gpuready.workload import make_workload

    w = make_workload(model="qwen2.5-0.5b", method="lora", grad_ckpt=True, seq=512, batch=2)
    prog = _build(resolve_model(w.model), w)
    assert len(prog.step_starts) == 3
    repeat = prog.repeat_span()
    assert repeat is not None and repeat[1] == prog.step_starts[2]
    events = list(prog.events)
    rc, _, skipped = _stats(fn, events, None, repeat)
    assert rc == 0 and skipped == len(events) - repeat[1]  # this job's last step repeats the one before it
    assert replay(events, None, repeat=repeat) == replay_reference(events, None)
    infer = _build(resolve_model("gpt2"), make_workload(model="gpt2", task="infer", new_tokens=4, seq=64))
    assert infer.step_starts == [] and infer.repeat_span() is None


def test_the_compiled_replay_under_sanitizers(tmp_path: Path) -> None:
    """tests/memory/replay_fuzz.c with AddressSanitizer and UBSan: random programs, and stepped ones with right,
    damaged and arbitrary repeat hints, with and without limits (the driver's comment runs it longer)."""
    cc = native._compiler()
    if cc is None:
        pytest.skip("no C compiler on this machine")
    exe = tmp_path / "replay_fuzz"
    here = Path(__file__).with_name("replay_fuzz.c")
    flags = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    built = subprocess.run(
        [cc, *flags, "-o", str(exe), str(here), str(native.SOURCE)], capture_output=True, timeout=120
    )
    if built.returncode != 0:
        pytest.skip(f"this compiler cannot build with the sanitizers: {built.stderr.decode()[-200:]}")
    done = subprocess.run([str(exe), "300", "300"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "differing from the plain replay 0" in done.stdout
