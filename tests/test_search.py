"""The one pure search (gpuready/search.py): what it claims about the values it tried."""

from __future__ import annotations

from gpuready.search import largest_passing


def test_monotone_test_finds_the_exact_boundary_from_any_start() -> None:
    for truth in (0, 1, 2, 7, 100, 1000):
        for start in (None, 1, 5, 999, 5000):
            found = largest_passing(lambda v, t=truth: v <= t, 1, 4096, start=start)
            assert found.value == truth, (truth, start)


def test_doubling_from_one_costs_a_logarithmic_number_of_tests() -> None:
    found = largest_passing(lambda v: v <= 1000, 1, 1 << 16)
    assert found.value == 1000
    assert found.tested <= 2 * 11 + 1


def test_a_good_start_costs_two_tests() -> None:
    found = largest_passing(lambda v: v <= 17, 1, 1 << 16, start=17)
    assert found.value == 17 and list(found.tried) == [17, 18]


def test_non_monotone_test_every_value_tried_below_the_answer_passed() -> None:
    """Reserve can fall as batch grows (mistral-7b batch 6/7/8/9 measured 77.5/82.3/71.7/86.2 GiB): the search's
    claim holds whatever the shape: the answer passed, every value tried below it passed, every one above failed."""
    bad = {7, 13, 40}
    found = largest_passing(lambda v: v <= 60 and v not in bad, 1, 1 << 10)
    assert found.tried[found.value]
    assert all(ok for v, ok in found.tried.items() if v <= found.value)
    assert not any(ok for v, ok in found.tried.items() if v > found.value)
    assert found.value + 1 in found.tried or found.value == 1 << 10


def test_the_upper_bound_is_returned_when_everything_passes() -> None:
    assert largest_passing(lambda v: True, 1, 300).value == 300
    assert largest_passing(lambda v: True, 1, 300, start=299, step=8).value == 300


def test_nothing_passes_gives_low_minus_one() -> None:
    assert largest_passing(lambda v: False, 1, 300).value == 0
    assert largest_passing(lambda v: False, 1, 300, start=50).value == 0


def test_checking_below_moves_the_answer_under_a_hole() -> None:
    """qwen2.5-7b LoRA + checkpointing on 40 GiB under the first (20%) margin: fits at 9 and 11, not at 10."""
    found = largest_passing(lambda v: v <= 11 and v != 10, 1, 1 << 10, start=12, check_below=8)
    assert found.value == 9
    assert all(found.tried[v] for v in range(1, 10))
    assert largest_passing(lambda v: v <= 11 and v != 10, 1, 1 << 10, start=12).value == 11


def test_first_passing_finds_the_threshold_of_a_monotone_test_with_few_tests() -> None:
    from gpuready.search import first_passing

    for n in (1, 2, 7, 30, 31, 64):
        for threshold in range(n + 1):  # threshold == n: none passes
            calls: list[int] = []

            def test(v: int, t: int = threshold, calls: list[int] = calls) -> bool:
                calls.append(v)
                return v >= t

            found = first_passing(test, 0, n - 1)
            assert found.value == threshold
            assert len(calls) <= max(1, (n).bit_length())
            assert all(found.tried[v] == (v >= threshold) for v in found.tried)


def test_first_passing_on_an_empty_range_passes_nothing() -> None:
    from gpuready.search import first_passing

    assert first_passing(lambda v: True, 5, 4).value == 5
