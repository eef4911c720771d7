"""The pruned BM25 search in PostgreSQL answers what reading every posting answers.

Integration pass only (DATABASE_URL=postgres://...). Real text: the Debian Reference sets of
eval/ (English and Chinese) and ../shared/eval/squad-dev where present, stored by ingestion's
own `store()`; the sets' own questions. The answers must be the same chunks in the same order
(ties broken by chunk id in both), with the same scores but for float rounding.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from django.db import connection

from retrieval.chunking import ChunkDraft
from retrieval.ingest import Prepared, store
from retrieval.lexical import K1, B
from retrieval.lexical_postgres import PROBE_POSTINGS_SHARE, PRUNED_SQL, PostgresLexicalStore
from retrieval.models import Chunk, Collection
from retrieval.postings import analyze_tables, chunk_terms
from tests.documents import add_document

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
SETS = (ROOT / "eval" / "debian-reference-cross", ROOT / "eval" / "debian-reference-zh")
SQUAD = ROOT.parent / "shared" / "eval" / "squad-dev"
QUERY_SETS = ("debian-reference-cross-en", "debian-reference-zh", "debian-reference-cross")
PASSAGES_PER_DOCUMENT = 5


@pytest.fixture(autouse=True)
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("runs in the integration pass (DATABASE_URL=postgres://...)")


def read_jsonl(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return [json.loads(line) for line in handle]


def store_set(collections: list[Collection], corpus: Path) -> None:
    texts = [row["text"] for row in read_jsonl(corpus / "corpus.jsonl")]
    for number, start in enumerate(range(0, len(texts), PASSAGES_PER_DOCUMENT)):
        part = texts[start : start + PASSAGES_PER_DOCUMENT]
        document = add_document(
            collections[number % len(collections)], f"{corpus.name}-{start}", "\n\n".join(part)
        )
        store(
            Prepared(document, [ChunkDraft(text, len(text.split()), 0, len(text)) for text in part])
        )


def skipped_postings(query: str, limit: int) -> int:
    """How many postings the pruned search skips for `query` (white box: its CTEs)."""
    counts = chunk_terms(query)
    terms = sorted(counts)
    # NOTE: the statement up to its `split` of the terms, then a count instead of the rest.
    head = PRUNED_SQL[: PRUNED_SQL.index("slack AS MATERIALIZED")].rstrip().rstrip(",")
    with connection.cursor() as cursor:
        cursor.execute(
            head + "\nSELECT coalesce(sum(df) FILTER (WHERE skipped), 0) FROM split",
            {
                "terms": terms,
                "counts": [float(counts[t]) for t in terms],
                "k1": K1,
                "b": B,
                "ready": "ready",
                "collections": None,
                "chunks": None,
                "limit": limit,
                "budget": PROBE_POSTINGS_SHARE,
                "probe": 2 * limit,
            },
        )
        return int(cursor.fetchone()[0])


def test_the_pruned_search_returns_the_exhaustive_searchs_answer_on_real_questions() -> None:
    collections = [Collection.objects.create(name=f"part-{i}") for i in range(3)]
    for corpus in (*SETS, SQUAD):
        if (corpus / "corpus.jsonl").is_file():
            store_set(collections, corpus)
    analyze_tables()
    questions = [
        row["text"]
        for name in QUERY_SETS
        for row in read_jsonl(ROOT / "eval" / name / "queries.jsonl")
    ]
    if (SQUAD / "queries.jsonl").is_file():
        questions += [row["text"] for row in read_jsonl(SQUAD / "queries.jsonl")][:300]
    questions += ["apt-get", "/etc/fstab", "的 了 是", "the"]
    pruned, exhaustive = PostgresLexicalStore(pruned=True), PostgresLexicalStore(pruned=False)
    some_chunks = np.fromiter(
        Chunk.objects.order_by("id").values_list("id", flat=True)[::2], np.int64
    )
    scopes: list[dict[str, object]] = [
        {},
        {"collection_ids": [collections[0].pk]},
        {"collection_ids": [collections[1].pk, collections[2].pk]},
        {"allowed_ids": some_chunks},
    ]
    compared = skipped = 0
    for limit in (1, 10, 50):
        for scope in scopes:
            for question in questions:
                expected = exhaustive.search(question, limit, **scope)  # type: ignore[arg-type]
                got = pruned.search(question, limit, **scope)  # type: ignore[arg-type]
                assert [i for i, _ in got] == [i for i, _ in expected], (question, limit, scope)
                assert [s for _, s in got] == pytest.approx([s for _, s in expected], rel=1e-12)
                compared += bool(expected)
        skipped += sum(skipped_postings(question, limit) for question in questions[::5])
    assert compared > 0.8 * 3 * len(scopes) * len(questions)
    assert skipped > 0  # the pruning did skip terms: the comparison tested it
