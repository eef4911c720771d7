"""What the BM25 tables in PostgreSQL hold, and the check that it is what a rebuild writes."""

from __future__ import annotations

from retrieval import postings
from retrieval.inverted_index import IndexedChunk, Posting, TermStats


def statistics() -> dict[str, object]:
    return {
        "df": dict(TermStats.objects.values_list("term", "df")),
        "corpus": postings.corpus_totals(),
        "postings": set(Posting.objects.values_list("term", "chunk_id", "tf", "length")),
        "chunks": set(IndexedChunk.objects.values_list("chunk_id", "length")),
    }


def assert_statistics_equal_a_rebuild() -> None:
    incremental = statistics()
    postings.rebuild()
    assert statistics() == incremental
