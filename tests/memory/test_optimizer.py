"""Optimizer steps (memory/optimizer.py) as programs of allocations."""

from __future__ import annotations

from gpuready.memory.optimizer import Trainable, optimizer_step
from gpuready.memory.program import Program, rounded


def test_adafactor_states_follow_each_parameters_shape() -> None:
    prog = Program()
    matrix = Trainable(4096 * 1024, 2, (4096, 1024))  # a bf16 linear weight: out x in
    vector = Trainable(1024, 2, (1024,))
    state = optimizer_step(prog, "adafactor", [matrix, vector], None)
    # row statistics (4096 fp32), column statistics (1024 fp32), the vector's whole second moment, two RMS scalars
    assert [prog.sizes[h] for h in state] == [4096 * 4, 1024 * 4, rounded(1024 * 4), 512, 512]
    assert prog.allocated == sum(prog.sizes[h] for h in state)  # every temporary freed by the step's end


def test_adafactor_step_holds_four_fp32_copies_of_a_16_bit_parameter() -> None:
    # transformers' Adafactor.step: grad.float(), p.float(), then grad ** 2 + eps and r x c (or -update) at once
    n = 4096 * 1024
    prog = Program()
    optimizer_step(prog, "adafactor", [Trainable(n, 2, (4096, 1024))], None)
    assert prog.phase_peaks["load"] >= 4 * 4 * n
    assert prog.phase_peaks["load"] < 4 * 4 * n + 1024 * 1024  # (the statistics and scalars beside them)
    fp32 = Program()
    optimizer_step(fp32, "adafactor", [Trainable(n, 4, (4096, 1024))], None)
    # an fp32 parameter and gradient are used as they are: two update-sized tensors at once
    assert 2 * 4 * n <= fp32.phase_peaks["load"] < 2 * 4 * n + 1024 * 1024


def test_adafactor_later_steps_replace_the_rms_and_keep_the_statistics() -> None:
    prog = Program()
    params = [Trainable(4096 * 1024, 2, (4096, 1024)), Trainable(1024, 2, (1024,))]
    first = optimizer_step(prog, "adafactor", params, None)
    kept = prog.allocated
    second = optimizer_step(prog, "adafactor", params, first)
    assert len(second) == len(first)
    assert second[:3] == first[:3]  # the statistics stay
    assert set(second[3:]).isdisjoint(first[3:])  # new RMS scalars, the old ones freed
    assert prog.allocated == kept
