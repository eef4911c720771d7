"""Keeping BM25's tables in the database (`retrieval.inverted_index`) in step with the chunks.

Every write of chunks goes through here, inside the transaction that writes the chunks:
`index_chunks` after creating them, `delete_chunks` (or `remove_chunks`, when Django deletes
them itself: a document's deletion) before deleting them. The statistics change by deltas:
each term's document frequency and one corpus shard's chunk count and total length.

NOTE (concurrency): a transaction adds its statistics once, at its end (`store()` collects the
deltas of a document's old and new chunks in one `StatsDeltas`): one upsert in term order, then
its shard row. Two ingestions that share terms (they all do) wait on each other only from there
to their commit, milliseconds (the embedding, seconds, is done before the transaction), and
cannot deadlock: both lock rows in the same order. The chunk count and total length are spread
over `NUM_CORPUS_SHARDS` rows by document id so that they add no row every ingestion queues on.
Deleting several documents in one transaction (a collection) applies deltas once per document;
it takes the statistics lock exclusively (other writers take it shared), so those passes
cannot deadlock with an ingestion either.

Only PostgreSQL keeps these tables (`is_maintained`); on SQLite the in-process bm25s store
rebuilds from the chunks and the calls here do nothing but delete the chunks.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet

from retrieval.analyzer import analyze
from retrieval.inverted_index import NUM_CORPUS_SHARDS, IndexedChunk
from retrieval.models import Chunk

logger = logging.getLogger(__name__)

# NOTE: the blocks here join their caller's transaction without a savepoint
# (`atomic(savepoint=False)`): any error rolls back the whole of it, chunks included, which is
# what must happen anyway, and a savepoint would cost two more round trips per call.

# Every transaction that changes the statistics takes this advisory lock, shared (one ordered
# pass: store()) or exclusive (several passes: see StatsDeltas.apply).
STATS_LOCK_KEY = 0x63616368_6574  # "cachet"
# Longer terms are cut to this many characters (in documents and queries alike): a btree entry
# must fit a page, and no query repeats a 200-character word anyway.
MAX_TERM_CHARS = 200
ANALYZED_TABLES = (
    "retrieval_posting",
    "retrieval_termstats",
    "retrieval_indexedchunk",
    "retrieval_corpusshard",
    "retrieval_document",
)


def is_maintained() -> bool:
    """Whether this database keeps BM25's tables (PostgreSQL)."""
    return connection.vendor == "postgresql"


def chunk_terms(text: str) -> Counter[str]:
    """Term -> frequency in `text`, as the in-process bm25s store counts them."""
    return Counter(term[:MAX_TERM_CHARS] for term in analyze(text))


@dataclass(slots=True)
class StatsDeltas:
    """What a transaction adds to TermStats and CorpusShard, applied once (`apply`)."""

    df: Counter[str] = field(default_factory=Counter)
    shards: dict[int, list[int]] = field(default_factory=dict)

    def add_chunk(self, document_id: int, length: int, sign: int = 1) -> None:
        shard = self.shards.setdefault(document_id % NUM_CORPUS_SHARDS, [0, 0])
        shard[0] += sign
        shard[1] += sign * length

    def apply(self, *, exclusive: bool = False) -> None:
        """Add the deltas in one statement per table, rows in key order (the module's NOTE).

        `exclusive`: for a transaction that applies deltas more than once (deleting several
        documents): it waits for other writers' transactions and holds them off until it ends,
        since its row locks, taken in several passes, are not in one order.
        """
        if not is_maintained():
            return
        deltas = sorted((term, delta) for term, delta in self.df.items() if delta)
        shards = sorted(
            (shard, n, total) for shard, (n, total) in self.shards.items() if n or total
        )
        if not deltas and not shards:
            return
        lock = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        with transaction.atomic(savepoint=False), connection.cursor() as cursor:
            cursor.execute(f"SELECT {lock}(%s)", [STATS_LOCK_KEY])
            if deltas:
                cursor.execute(
                    "INSERT INTO retrieval_termstats AS s (term, df)"
                    " SELECT * FROM unnest(%s::text[], %s::bigint[]) ORDER BY 1"
                    " ON CONFLICT (term) DO UPDATE SET df = s.df + EXCLUDED.df",
                    [[t for t, _ in deltas], [d for _, d in deltas]],
                )
                gone = [term for term, delta in deltas if delta < 0]
                if gone:
                    cursor.execute(
                        "DELETE FROM retrieval_termstats WHERE term = ANY(%s) AND df <= 0", [gone]
                    )
            for shard, count, total in shards:
                cursor.execute(
                    "INSERT INTO retrieval_corpusshard AS s (shard, num_chunks, total_length)"
                    " VALUES (%s, %s, %s) ON CONFLICT (shard) DO UPDATE SET"
                    " num_chunks = s.num_chunks + EXCLUDED.num_chunks,"
                    " total_length = s.total_length + EXCLUDED.total_length",
                    [shard, count, total],
                )
        self.df.clear()
        self.shards.clear()


def index_chunks(chunks: Iterable[Chunk], deltas: StatsDeltas | None = None) -> None:
    """Add the postings of new chunks, and their statistics to `deltas` (None: apply now)."""
    if not is_maintained():
        return
    own = deltas is None
    deltas = deltas or StatsDeltas()
    chunk_ids: list[int] = []
    lengths: list[int] = []
    terms: list[str] = []
    posting_chunks: list[int] = []
    posting_documents: list[int] = []
    tfs: list[int] = []
    posting_lengths: list[int] = []
    for chunk in chunks:
        counts = chunk_terms(chunk.text)
        length = sum(counts.values())
        chunk_ids.append(chunk.pk)
        lengths.append(length)
        for term, tf in counts.items():
            terms.append(term)
            posting_chunks.append(chunk.pk)
            posting_documents.append(chunk.document_id)
            tfs.append(tf)
            posting_lengths.append(length)
        deltas.df.update(counts.keys())
        deltas.add_chunk(chunk.document_id, length)
    if not chunk_ids:
        return
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO retrieval_indexedchunk (chunk_id, length)"
            " SELECT * FROM unnest(%s::bigint[], %s::int[])",
            [chunk_ids, lengths],
        )
        cursor.execute(
            "INSERT INTO retrieval_posting (term, chunk_id, document_id, tf, length)"
            " SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::int[], %s::int[])",
            [terms, posting_chunks, posting_documents, tfs, posting_lengths],
        )
        if own:
            deltas.apply()


def remove_chunks(
    chunk_ids: Sequence[int], deltas: StatsDeltas | None = None, *, exclusive: bool = False
) -> None:
    """Take chunks out of the postings (before the chunks themselves go); their statistics go
    to `deltas` (None: applied now, `exclusive` as `StatsDeltas.apply` says)."""
    if not chunk_ids or not is_maintained():
        return
    own = deltas is None
    deltas = deltas or StatsDeltas()
    ids = list(chunk_ids)
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        # NOTE: the document id decides the shard; a chunk's document never changes.
        cursor.execute(
            "WITH gone AS (DELETE FROM retrieval_indexedchunk i WHERE i.chunk_id = ANY(%s)"
            " RETURNING i.chunk_id, i.length)"
            " SELECT c.document_id, gone.length"
            " FROM gone JOIN retrieval_chunk c ON c.id = gone.chunk_id",
            [ids],
        )
        for document_id, length in cursor.fetchall():
            deltas.add_chunk(int(document_id), int(length), sign=-1)
        cursor.execute(
            "WITH gone AS (DELETE FROM retrieval_posting p WHERE p.chunk_id = ANY(%s)"
            " RETURNING p.term) SELECT term, count(*) FROM gone GROUP BY term",
            [ids],
        )
        deltas.df.update({term: -int(count) for term, count in cursor.fetchall()})
        if own:
            deltas.apply(exclusive=exclusive)


def delete_chunks(chunks: QuerySet[Chunk], deltas: StatsDeltas | None = None) -> list[int]:
    """Delete `chunks` with their postings, in one transaction; returns their ids.

    Their statistics go to `deltas` when given (the caller applies them), else are applied.
    """
    with transaction.atomic(savepoint=False):
        chunk_ids = list(chunks.values_list("id", flat=True))
        remove_chunks(chunk_ids, deltas)
        Chunk.objects.filter(id__in=chunk_ids).delete()
    return chunk_ids


def backfill(batch_size: int = 2000) -> int:
    """Index every chunk that has no postings yet (an existing deployment upgrading); the count.

    Each batch is a transaction of its own, so a long backfill can stop and resume; chunks that
    ingestion indexes meanwhile are skipped, being indexed already.
    """
    if not is_maintained():
        raise RuntimeError("BM25's tables are kept on PostgreSQL only; this database is not.")
    done = 0
    last_id = 0
    while True:
        with transaction.atomic():
            batch = list(
                _unindexed()
                .filter(id__gt=last_id)
                .only("id", "document_id", "text")
                .order_by("id")[:batch_size]
            )
            if not batch:
                break
            index_chunks(batch)
        done += len(batch)
        last_id = batch[-1].pk
        logger.info("BM25 postings: %d chunks indexed (up to id %d)", done, last_id)
    if done:
        analyze_tables()
    return done


def analyze_tables() -> None:
    """Refresh the planner's statistics of the tables a search reads, after a bulk load.

    NOTE: the search query's plan depends on them; after a bulk load they are stale until
    autovacuum analyzes the tables (within a minute, or never where it is off), and a plan made
    for a table of two documents took a second a query over 2,000 of them.
    """
    if is_maintained():
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {', '.join(ANALYZED_TABLES)}")


def rebuild() -> int:
    """Drop every posting and statistic and index all chunks again, in one transaction.

    For a check or a repair (`manage.py backfill_postings --rebuild`): the statistics after it
    are what per-document updates should have left. Ingestions wait for it (their statistics
    deltas queue behind its lock), and searches meanwhile see the old index.
    """
    if not is_maintained():
        raise RuntimeError("BM25's tables are kept on PostgreSQL only; this database is not.")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [STATS_LOCK_KEY])
        for table in ("posting", "indexedchunk", "termstats", "corpusshard"):
            cursor.execute(f"DELETE FROM retrieval_{table}")
        return backfill()


def _unindexed() -> QuerySet[Chunk]:
    return Chunk.objects.filter(~Exists(IndexedChunk.objects.filter(chunk_id=OuterRef("pk"))))


def corpus_totals() -> tuple[int, int]:
    """(number of indexed chunks, their total length) from the shards."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(num_chunks), 0), coalesce(sum(total_length), 0)"
            " FROM retrieval_corpusshard"
        )
        row = cursor.fetchone()
    return int(row[0]), int(row[1])
