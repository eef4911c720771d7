"""bench.lexical_bulk_load writes what ingestion's store() writes, row for row.

Integration pass only (DATABASE_URL=postgres://...): the tables are PostgreSQL's. The same
documents (real English and Chinese passages of eval/) are stored once through store() and once
through the bulk loader; every table BM25 reads, and the chunks, must come out the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.db import connection

from bench.lexical_bulk_load import BulkLoader
from retrieval.chunking import ChunkDraft
from retrieval.ingest import Prepared, store
from retrieval.models import Chunk, Collection, Document

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

EVAL = Path(__file__).resolve().parents[2] / "eval"
CHUNKS_PER_DOCUMENT = 3

Rows = dict[str, list[tuple[object, ...]]]


@pytest.fixture(autouse=True)
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("runs in the integration pass (DATABASE_URL=postgres://...)")


def passages() -> list[str]:
    texts = []
    for set_name in ("debian-reference-zh", "debian-reference-cross"):
        with (EVAL / set_name / "corpus.jsonl").open() as handle:
            texts += [json.loads(line)["text"] for _, line in zip(range(45), handle, strict=False)]
    # A chunk with no terms at all: counted in the corpus (N, IndexedChunk), no postings.
    return [*texts, "!!! ... ???"]


def documents() -> list[Prepared]:
    tenth = Collection.objects.create(name="tenth")
    everything = Collection.objects.create(name="everything")
    texts = passages()
    prepared = []
    for number, start in enumerate(range(0, len(texts), CHUNKS_PER_DOCUMENT)):
        document = Document.objects.create(
            collection=tenth if number % 10 == 0 else everything, title=f"doc-{number}"
        )
        drafts = [
            ChunkDraft(text, len(text.split()), 7 * ordinal, 7 * ordinal + len(text))
            for ordinal, text in enumerate(texts[start : start + CHUNKS_PER_DOCUMENT])
        ]
        drafts[0].page, drafts[0].heading_path = 3, ["Part", "Section"]
        prepared.append(Prepared(document, drafts))
    return prepared


def snapshot() -> Rows:
    """Every row store() writes, chunk ids replaced by (document, ordinal): ids differ."""
    queries = {
        "chunks": "SELECT document_id, ordinal, text, token_count, char_start, char_end, page,"
        " heading_path::text FROM retrieval_chunk",
        "indexed chunks": "SELECT c.document_id, c.ordinal, i.length FROM retrieval_indexedchunk i"
        " JOIN retrieval_chunk c ON c.id = i.chunk_id",
        "postings": "SELECT p.term, c.document_id, c.ordinal, p.document_id, p.tf, p.length"
        " FROM retrieval_posting p JOIN retrieval_chunk c ON c.id = p.chunk_id",
        "term statistics": "SELECT term, df FROM retrieval_termstats",
        "corpus shards": "SELECT shard, num_chunks, total_length FROM retrieval_corpusshard",
        "documents": "SELECT id, status, progress, error FROM retrieval_document",
        "posting constraints": "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'retrieval_posting'::regclass",
        "posting indexes": "SELECT indexname, indexdef FROM pg_indexes"
        " WHERE tablename = 'retrieval_posting'",
    }
    rows: Rows = {}
    with connection.cursor() as cursor:
        for name, query in queries.items():
            cursor.execute(query)
            rows[name] = sorted(cursor.fetchall(), key=repr)
    return rows


def forget_stored_chunks(prepared: list[Prepared]) -> None:
    """Back to the documents as they were before store(): queued, no chunks, empty index."""
    with connection.cursor() as cursor:
        # NOTE: the test's own transaction never commits, so the deferred foreign-key checks of
        # store()'s rows are still pending, which ALTER TABLE (the loader's) refuses to run on.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for table in ("posting", "indexedchunk", "termstats", "corpusshard", "chunk"):
            cursor.execute(f"DELETE FROM retrieval_{table}")
    Document.objects.filter(pk__in=[p.document.pk for p in prepared]).update(
        status=Document.Status.QUEUED, progress=0
    )


def test_the_bulk_loader_writes_the_rows_store_writes() -> None:
    prepared = documents()
    for document in prepared:
        store(document)
    stored = snapshot()
    forget_stored_chunks(prepared)
    assert not Chunk.objects.exists()

    loader = BulkLoader()
    loader.start()
    loader.add(prepared[:5])  # two batches: statistics added up across them
    loader.add(prepared[5:])
    loader.finish()

    loaded = snapshot()
    assert loader.num_chunks == len(passages())
    assert len(stored["postings"]) > 3000 and any(
        "\u4e00" <= row[0][0] <= "\u9fff"  # type: ignore[index, operator]
        for row in stored["postings"]
    )
    for table, rows in stored.items():
        assert loaded[table] == rows, table
