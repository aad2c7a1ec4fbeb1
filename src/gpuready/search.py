"""The one search for the largest value that passes a pure test (no runs: the test is a computation).

Used for the largest batch that fits (memory/estimate.py, memory/trace.py) and for the estimator's predicted
maximum that starts the measured search (trial/search.py, which keeps its own measured steps); `first_passing`, the
plain bisection for a test known to be monotone, for the smallest card a job fits (plan/plan.py).

The search gallops from `start` (doubling the step) until the test fails, then bisects between the largest value
that passed and the smallest that failed. So whatever the shape of the test, the answer passed, every value tried
below it passed, and every value tried above it failed (the value right above the answer among them, unless the
answer is `high`). It does not test the values it skipped: a test that is not monotone can fail at one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Found:
    value: int  # the largest value found to pass; low - 1 when `low` itself fails
    tried: dict[int, bool] = field(default_factory=dict)  # value -> passed, in the order tried

    @property
    def tested(self) -> int:
        return len(self.tried)


def largest_passing(
    test: Callable[[int], bool],
    low: int,
    high: int,
    start: int | None = None,
    step: int | None = None,
    check_below: int = 0,
) -> Found:
    """Largest v in [low, high] with test(v), galloping up (or down) from `start` by `step`, 2 `step`, 4 `step`,
    ... (default: from `low`, doubling; from a given `start`, steps from 1), then bisecting. With `check_below`,
    the answer is moved down until the `check_below` values right below it pass too (for a test that is not
    monotone: the answer then passes with every value down to answer - check_below)."""
    found = _largest_passing(test, low, high, start, step)
    if check_below <= 0 or found.value < low:
        return found
    tried = dict(found.tried)
    best = found.value
    v = best - 1
    while v >= max(low, best - check_below):
        if v not in tried:
            tried[v] = test(v)
        if not tried[v]:
            best = v - 1
        v -= 1
    return Found(best, tried)


def _largest_passing(test: Callable[[int], bool], low: int, high: int, start: int | None, step: int | None) -> Found:
    tried: dict[int, bool] = {}

    def passes(v: int) -> bool:
        if v not in tried:
            tried[v] = test(v)
        return tried[v]

    if high < low:
        return Found(low - 1, tried)
    first = min(max(start if start is not None else low, low), high)
    lo, hi = low - 1, high + 1  # lo passed (low - 1: nothing yet), hi failed (high + 1: nothing yet)
    if passes(first):
        lo = first
        step = step or (max(1, first - low + 1) if start is None else 1)
        while hi == high + 1:
            nxt = min(high, lo + step)
            if nxt == lo:
                return Found(lo, tried)
            if passes(nxt):
                lo, step = nxt, step * 2
            else:
                hi = nxt
    else:
        hi, step = first, step or 1
        while lo == low - 1:
            nxt = max(low, hi - step)
            if nxt == hi:
                return Found(low - 1, tried)
            if passes(nxt):
                lo = nxt
            else:
                hi, step = nxt, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return Found(lo, tried)


def first_passing(test: Callable[[int], bool], low: int, high: int) -> Found:
    """Smallest v in [low, high] with test(v), for a test that fails up to some value and passes from there on
    (fitting is monotone in a card's memory): plain bisection, about log2(high - low + 1) tests. `value` is
    high + 1 when none passes."""
    tried: dict[int, bool] = {}
    lo, hi = low, high + 1  # the answer lies in [lo, hi]; hi = high + 1: none passes
    while lo < hi:
        mid = (lo + hi) // 2
        tried[mid] = test(mid)
        if tried[mid]:
            hi = mid
        else:
            lo = mid + 1
    return Found(lo, tried)
