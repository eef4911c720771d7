"""How sure a paired difference of means is: a percentile bootstrap over the pairs.

Two ways of answering the same questions (full prefill and chunk-KV reuse) differ question by
question far more than on average (one answer right, the other wrong), so a difference of mean
F1 over 50 questions says little by itself; resampling the questions with their pairs gives the
interval that an "at most 0.02 worse" claim has to sit in.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence


def paired_difference_interval(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """The `confidence` percentile-bootstrap interval of mean(candidate - baseline), resampling
    pairs with replacement (seeded, so a report can be reproduced)."""
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError("needs the same number of values, at least one, on both sides")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    differences = [b - a for a, b in zip(baseline, candidate, strict=True)]
    draw = random.Random(seed).choices
    means = sorted(
        statistics.fmean(draw(differences, k=len(differences))) for _ in range(resamples)
    )
    cut = round((1 - confidence) / 2 * (resamples - 1))  # the same count off either end
    return means[cut], means[-1 - cut]
