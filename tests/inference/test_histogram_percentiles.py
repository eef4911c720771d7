"""Percentile estimates from histogram buckets: interpolated inside their bucket, which is given."""

from __future__ import annotations

import pytest

from inference.histogram_percentiles import (
    bucket_difference,
    estimate_percentile,
    estimate_percentiles,
)

BOUNDS = (1.0, 2.0, 4.0)


def test_a_percentile_is_interpolated_inside_the_bucket_that_holds_its_rank() -> None:
    # 2 observations <= 1, 4 in (1, 2], 2 in (2, 4]: the 4th of 8 is halfway through (1, 2].
    estimate = estimate_percentile(BOUNDS, (2, 6, 8, 8), 0.5)
    assert estimate is not None
    assert (estimate.lower, estimate.upper) == (1.0, 2.0)
    assert estimate.value == pytest.approx(1.5)


def test_the_first_bucket_starts_at_zero() -> None:
    estimate = estimate_percentile(BOUNDS, (4, 4, 4, 4), 0.5)
    assert estimate is not None and (estimate.lower, estimate.upper) == (0.0, 1.0)
    assert estimate.value == pytest.approx(0.5)


def test_a_percentile_beyond_the_last_bound_reads_as_that_bound_with_no_upper_limit() -> None:
    estimate = estimate_percentile(BOUNDS, (0, 0, 1, 10), 0.99)
    assert estimate is not None
    assert (estimate.value, estimate.lower, estimate.upper) == (4.0, 4.0, None)


def test_an_empty_histogram_has_no_percentiles() -> None:
    assert estimate_percentile(BOUNDS, (0, 0, 0, 0), 0.5) is None
    assert estimate_percentiles(BOUNDS, (0, 0, 0, 0)) == []


def test_counts_that_do_not_match_the_bounds_or_a_quantile_outside_0_1_are_refused() -> None:
    with pytest.raises(ValueError, match="4 cumulative counts"):
        estimate_percentile(BOUNDS, (1, 2, 3), 0.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        estimate_percentile(BOUNDS, (1, 2, 3, 3), 50)


def test_the_difference_of_two_readings_counts_a_restarted_histogram_from_zero() -> None:
    assert bucket_difference((3, 5, 9, 9), (1, 2, 4, 4)) == [2, 3, 5, 5]
    assert bucket_difference((1, 1, 2, 2), (3, 5, 9, 9)) == [1, 1, 2, 2]
