"""retrieval.explain and Retriever.ranked_pool: the whole candidate pool behind search(), with
real BM25, real embeddings and the configured reranker."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from retrieval.explain import explain
from retrieval.ingest import ingest
from retrieval.models import Collection
from retrieval.search import search
from tests.documents import HANDBOOK, KITCHEN, add_document

pytestmark = pytest.mark.django_db

NOTES = (
    "# Notes\n## Parking\nVisitors park behind the building on weekdays.\n"
    "## Mail\nPost arrives at ten and leaves at four.\n"
)


@pytest.fixture
def library(retriever):
    hr = Collection.objects.create(name="hr")
    ops = Collection.objects.create(name="ops")
    for collection, name, text in (
        (hr, "handbook.md", HANDBOOK),
        (hr, "notes.md", NOTES),
        (ops, "kitchen.txt", KITCHEN),
    ):
        ingest(add_document(collection, name, text).pk, retriever)
    return hr, ops


@pytest.mark.parametrize("mode", ["hybrid+rerank", "hybrid", "bm25", "dense"])
def test_the_pools_head_is_what_search_returns(library, mode) -> None:
    explanation = explain("paid holiday days each year", top_k=2, mode=mode)
    hits = search("paid holiday days each year", top_k=2, mode=mode)
    assert [e.hit.chunk_id for e in explanation.kept] == [h.chunk_id for h in hits]
    assert [e.hit.score for e in explanation.kept] == [h.score for h in hits]
    ranks = list(range(1, len(explanation.pool) + 1))
    assert [e.final_rank for e in explanation.pool] == ranks
    assert sorted(e.fused_rank for e in explanation.pool) == ranks


def test_each_candidate_carries_its_bm25_and_dense_scores_and_ranks(library) -> None:
    explanation = explain("paid holiday days each year", top_k=1)
    assert explanation.reranker and explanation.dense_ready
    top = explanation.pool[0]
    assert "thirty days" in top.hit.text
    assert top.lexical_score is not None and top.lexical_rank == 1
    assert top.dense_score is not None and -1.0 <= top.dense_score <= 1.0
    by_lexical = sorted(
        (e for e in explanation.pool if e.lexical_score is not None),
        key=lambda e: e.lexical_rank or 0,
    )
    scores = [e.lexical_score for e in by_lexical]
    assert scores == sorted(scores, reverse=True)
    # Every chunk is in the dense list (the index holds all five); BM25 finds only word matches.
    assert all(e.dense_rank is not None for e in explanation.pool)
    assert any(e.lexical_score is None for e in explanation.pool)
    # Before reranking the pool is in fused order: the fused scores fall with the fused rank.
    fused = [e.fused_score for e in sorted(explanation.pool, key=lambda e: e.fused_rank)]
    assert fused == sorted(fused, reverse=True)


def test_the_cutoff_names_top_k_and_the_scores_either_side_of_it(library) -> None:
    explanation = explain("paid holiday days each year", top_k=2)
    assert len(explanation.pool) > 2
    kept, dropped = explanation.last_kept, explanation.first_dropped
    assert kept is not None and dropped is not None
    assert kept.final_rank == 2 and dropped.final_rank == 3
    reason = explanation.cutoff_reason
    assert "Top-K is 2" in reason
    assert f"{kept.hit.score:.4f}" in reason and f"{dropped.hit.score:.4f}" in reason

    everything = explain("paid holiday days each year", top_k=50)
    assert everything.first_dropped is None and "All" in everything.cutoff_reason


def test_a_reader_sees_only_the_pool_of_collections_they_may_read(library) -> None:
    hr, ops = library
    reader = User.objects.create_user("reader")
    hr.readers.add(reader)
    pool = explain("kitchen holiday parking", top_k=5, user=reader).pool
    assert pool and {e.hit.collection_name for e in pool} == {"hr"}
    nothing = explain("kitchen", [ops], top_k=5, user=reader)
    assert nothing.pool == [] and "No candidates" in nothing.cutoff_reason


def test_bad_input_is_refused(library) -> None:
    assert explain("   ", top_k=3).pool == []
    with pytest.raises(ValueError, match="top_k"):
        explain("kitchen", top_k=0)
    with pytest.raises(ValueError, match="mode"):
        explain("kitchen", top_k=1, mode="magic")
