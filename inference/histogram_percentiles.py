"""Percentile estimates from Prometheus histogram buckets, with the bucket they fall in.

A histogram keeps only how many observations fell at or below each bucket bound, so a percentile
is known only to lie inside one bucket; within it we interpolate linearly, as Prometheus'
`histogram_quantile` does. The estimate comes with its bucket (`lower`, `upper`): a p99 that
reads 0.62 s from the (0.5, 0.75] bucket means "between 0.5 and 0.75 s", nothing finer. A
percentile in the last, unbounded bucket is reported as the highest finite bound (a lower
limit, `upper` is None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PERCENTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True, slots=True)
class PercentileEstimate:
    quantile: float
    value: float
    lower: float  # the bucket the percentile lies in: (lower, upper]
    upper: float | None  # None: the +Inf bucket, so `value` is only a lower limit

    def as_json(self) -> dict[str, float | None]:
        return {"q": self.quantile, "value": self.value, "lower": self.lower, "upper": self.upper}


def estimate_percentile(
    bounds: Sequence[float], cumulative: Sequence[float], quantile: float
) -> PercentileEstimate | None:
    """The `quantile` (0-1) of a histogram: `bounds` are the finite upper bounds in order,
    `cumulative` the counts at or below each bound followed by the total (the +Inf bucket).
    None when the histogram holds no observation."""
    if len(cumulative) != len(bounds) + 1:
        raise ValueError(f"{len(bounds)} bounds need {len(bounds) + 1} cumulative counts")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be between 0 and 1, not {quantile}")
    total = cumulative[-1]
    if total <= 0:
        return None
    rank = quantile * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=False):
        if count >= rank and count > below:
            fraction = (rank - below) / (count - below)
            return PercentileEstimate(quantile, lower + (bound - lower) * fraction, lower, bound)
        lower, below = bound, count
    return PercentileEstimate(quantile, lower, lower, None)


def estimate_percentiles(
    bounds: Sequence[float], cumulative: Sequence[float], quantiles: Sequence[float] = PERCENTILES
) -> list[PercentileEstimate]:
    """Every estimate of `quantiles` that the histogram can give (none when it is empty)."""
    estimates = (estimate_percentile(bounds, cumulative, q) for q in quantiles)
    return [estimate for estimate in estimates if estimate is not None]


def bucket_difference(newer: Sequence[float], older: Sequence[float]) -> list[float]:
    """The observations between two readings of one histogram's cumulative counts; a histogram
    that restarted (its engine was replaced) counts from zero, as Prometheus' `increase` does."""
    if newer[-1] < older[-1] or any(math.isnan(value) for value in newer):
        return list(newer)
    return [max(0.0, n - o) for n, o in zip(newer, older, strict=True)]
