"""bench.paired_bootstrap: the interval of a paired difference of means."""

from __future__ import annotations

import random

import pytest

from bench.paired_bootstrap import paired_difference_interval


def test_a_constant_difference_has_no_spread() -> None:
    baseline = [0.0, 0.5, 1.0, 0.25]
    assert paired_difference_interval(baseline, [x + 0.1 for x in baseline]) == pytest.approx(
        (0.1, 0.1)
    )


def test_the_interval_holds_the_true_difference_and_narrows_with_more_pairs() -> None:
    rng = random.Random(3)

    def pairs(n: int) -> tuple[list[float], list[float]]:
        baseline = [float(rng.random() < 0.6) for _ in range(n)]  # right or wrong, as F1 often is
        candidate = [float(rng.random() < 0.5) for _ in range(n)]  # 0.1 worse on average
        return baseline, candidate

    low, high = paired_difference_interval(*pairs(2000))
    assert low < -0.1 < high
    small_low, small_high = paired_difference_interval(*pairs(50))
    assert high - low < (small_high - small_low) / 3  # ~ sqrt(2000 / 50) = 6.3x narrower


def test_mismatched_or_empty_sides_are_refused() -> None:
    with pytest.raises(ValueError, match="same number"):
        paired_difference_interval([1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="same number"):
        paired_difference_interval([], [])
    with pytest.raises(ValueError, match="confidence"):
        paired_difference_interval([1.0], [1.0], confidence=1.0)
