"""retrieval.fusion: reciprocal rank fusion and weighted score fusion on hand-computed inputs."""

from __future__ import annotations

import pytest

from retrieval.fusion import reciprocal_rank_fusion, weighted_score_fusion


def test_rrf_sums_reciprocal_ranks_over_the_lists_that_hold_an_item() -> None:
    fused = dict(reciprocal_rank_fusion([[(1, 9.0), (2, 5.0)], [(2, 0.9), (3, 0.1)]], k=10))
    assert fused[1] == pytest.approx(1 / 11)
    assert fused[2] == pytest.approx(1 / 12 + 1 / 11)
    assert fused[3] == pytest.approx(1 / 12)


def test_rrf_orders_by_fused_score_and_ignores_raw_scores() -> None:
    ranking = reciprocal_rank_fusion([[(1, 100.0), (2, 0.1)], [(2, 0.5), (1, 0.4)]])
    assert {item for item, _ in ranking} == {1, 2}
    assert ranking[0][1] == ranking[1][1]  # rank 1 + rank 2 either way
    assert reciprocal_rank_fusion([[], []]) == []


def test_weighted_fusion_min_max_normalises_each_list_then_weights_it() -> None:
    lexical = [(1, 10.0), (2, 6.0), (3, 2.0)]  # normalised 1, 0.5, 0
    dense = [(3, 0.9), (1, 0.5)]  # normalised 1, 0
    fused = dict(weighted_score_fusion([lexical, dense], [0.6, 0.4]))
    assert fused == pytest.approx({1: 0.6, 2: 0.3, 3: 0.4})


def test_weighted_fusion_of_a_single_item_list_counts_it_fully() -> None:
    assert weighted_score_fusion([[(5, 3.0)], []], [0.25, 0.75]) == [(5, 0.25)]
