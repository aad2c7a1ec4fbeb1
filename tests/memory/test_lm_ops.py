"""memory/lm/ops.py: the ops written once for every block program (rotary embedding, RMSNorm's pieces)."""

from __future__ import annotations

from gpuready.memory.lm.autograd import Layer
from gpuready.memory.lm.ops import rms_norm_frozen, rms_norm_start, rope
from gpuready.memory.program import Program


def test_rope_allocates_the_two_products_rotate_half_and_the_sum_in_that_order() -> None:
    prog = Program()
    out = rope(prog, tokens=4, width=1024, act=2)
    n = 4 * 1024 * 2
    # cos product, -x2 (half), cat, (-x2 freed), sin product, (cat freed), the sum, both products freed
    assert prog.events == [n, n // 2, n, -2, n, -3, n, -1, -4]
    assert out == 5 and prog.allocated == n  # only the rotated tensor stays
    assert prog.peak_allocated == 3 * n  # cos product, cat and sin product; -x2 is gone before the third


def test_rope_without_output_leaves_nothing_allocated() -> None:
    prog = Program()
    assert rope(prog, tokens=4, width=1024, act=2, output=False) == 0
    assert prog.allocated == 0 and prog.peak_allocated == 3 * 4 * 1024 * 2


def test_rms_norm_start_keeps_the_fp32_input_for_backward_and_returns_x_times_rsqrt() -> None:
    prog = Program()
    layer = Layer(prog, keep=True)
    y32 = rms_norm_start(layer, tokens=8, width=512, act=2)
    n = 8 * 512
    assert [s.handle for s in layer.saved] == [1]  # x.to(fp32), kept by pow
    assert layer.saved[0].grad_bytes == n * 2 and layer.saved[0].transient == (n * 4,) * 3
    assert prog.events == [n * 4, n * 4, -2, n * 4] and y32 == 3


def test_rms_norm_start_without_autograd_makes_the_fp32_input_a_temporary() -> None:
    prog = Program()
    layer = Layer(prog, keep=False)
    rms_norm_start(layer, tokens=8, width=512, act=2)
    assert layer.saved == [] and layer.temps == [1]


def test_rms_norm_frozen_frees_everything_but_the_output() -> None:
    prog = Program()
    layer = Layer(prog, keep=True)
    y32 = rms_norm_start(layer, tokens=8, width=512, act=2)
    out = rms_norm_frozen(layer, y32, tokens=8, width=512, dtype=2)
    n = 8 * 512
    assert prog.size_of(out) == n * 2
    assert prog.allocated == n * 4 + n * 2  # the kept fp32 input and the output
