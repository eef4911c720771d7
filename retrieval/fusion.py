"""Fusing ranked lists from lexical and dense search."""

from __future__ import annotations

from collections.abc import Sequence

RRF_K = 60


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[tuple[int, float]]], k: int = RRF_K
) -> list[tuple[int, float]]:
    """Cormack et al. 2009: score = sum of 1 / (k + rank) over the lists holding an item."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, (item, _) in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(fused.items(), key=lambda pair: pair[1], reverse=True)


def weighted_score_fusion(
    rankings: Sequence[Sequence[tuple[int, float]]], weights: Sequence[float]
) -> list[tuple[int, float]]:
    """Convex combination of min-max normalised scores (an item missing from a list gets 0)."""
    fused: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights, strict=False):
        if not ranking:
            continue
        scores = [score for _, score in ranking]
        low, high = min(scores), max(scores)
        for item, score in ranking:
            # NOTE: a list whose scores are all equal (one hit) ranks its items first, not last.
            normalised = (score - low) / (high - low) if high > low else 1.0
            fused[item] = fused.get(item, 0.0) + weight * normalised
    return sorted(fused.items(), key=lambda pair: pair[1], reverse=True)
