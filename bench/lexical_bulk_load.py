"""Writing a benchmark corpus into the chunk and BM25 tables by binary COPY, as store() would.

`retrieval.ingest.store()` writes one document a transaction (chunks, postings, statistics) at
150-270 chunks/s here: a million chunks would take 1.5 hours. `BulkLoader` writes the same rows
for new documents many thousands of chunks at a time: the chunks, their `IndexedChunk` rows and
postings by binary COPY, terms counted by `retrieval.postings.chunk_terms` (what store()
indexes), the statistics added once at the end through `StatsDeltas` (store()'s own upsert),
and the documents marked ready as store() marks them. The tables' contents are store()'s row for
row (tests/bench/test_lexical_bulk_load.py compares them); their physical layout is not: the
postings' indexes are built once after the load, packed, where store()'s grow by page splits.

For a throwaway benchmark database only: it drops the postings' key, index and foreign key for
the load and builds them again at the end (`finish`), as no live search could bear.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from retrieval.ingest import Prepared
from retrieval.models import Chunk, Document
from retrieval.postings import StatsDeltas, analyze_tables, chunk_terms

logger = logging.getLogger(__name__)

POSTING = "retrieval_posting"
# What a COPY into the postings table would otherwise check or update row by row: a deferred
# foreign-key trigger per posting (tens of millions queued to the commit) and two btrees fed
# in term order (random pages). Built once at the end instead: one sort each, one join.
CONSTRAINT_KINDS = ("p", "f")  # primary key, foreign keys: dropped and added back


class BulkLoader:
    """Add documents' chunks with their postings in large batches; `finish()` once at the end."""

    def __init__(self) -> None:
        self._deltas = StatsDeltas()
        self._constraints: list[tuple[str, str]] = []
        self._indexes: list[str] = []
        self._chunk_sequence = ""
        self.num_chunks = 0
        self.num_postings = 0
        self._started = False

    def start(self) -> None:
        """Drop the postings' key, foreign key and indexes (kept to build again in `finish`)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = %s::regclass AND contype = ANY(%s) ORDER BY contype, conname",
                [POSTING, list(CONSTRAINT_KINDS)],
            )
            self._constraints = [(name, definition) for name, definition in cursor.fetchall()]
            cursor.execute(
                "SELECT indexdef FROM pg_indexes i WHERE tablename = %s AND NOT EXISTS"
                " (SELECT 1 FROM pg_constraint c WHERE c.conindid = (quote_ident(i.indexname))"
                "::regclass AND c.conrelid = %s::regclass) ORDER BY indexname",
                [POSTING, POSTING],
            )
            self._indexes = [definition for (definition,) in cursor.fetchall()]
            cursor.execute("SELECT pg_get_serial_sequence('retrieval_chunk', 'id')")
            self._chunk_sequence = cursor.fetchone()[0]
            for name, _ in self._constraints:
                cursor.execute(f'ALTER TABLE {POSTING} DROP CONSTRAINT "{name}"')
            cursor.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = %s ORDER BY indexname",
                [POSTING],
            )
            for (name,) in cursor.fetchall():
                cursor.execute(f'DROP INDEX "{name}"')
        self._started = True

    def add(self, documents: Sequence[Prepared]) -> None:
        """Write these (saved, still chunkless) documents' chunks and postings; one transaction."""
        if not self._started:
            raise RuntimeError("BulkLoader.start() first")
        num_chunks = sum(len(prepared.drafts) for prepared in documents)
        if not num_chunks:
            return
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT nextval(%s) FROM generate_series(1, %s)",
                [self._chunk_sequence, num_chunks],
            )
            chunk_ids = iter([chunk_id for (chunk_id,) in cursor.fetchall()])
            raw = cursor.cursor  # psycopg's own cursor, for COPY
            chunk_copy = (
                "COPY retrieval_chunk (id, document_id, ordinal, text, token_count, char_start,"
                " char_end, page, heading_path) FROM STDIN (FORMAT BINARY)"
            )
            indexed: list[tuple[int, int]] = []
            postings: list[tuple[str, int, int, int, int]] = []
            with raw.copy(chunk_copy) as copy:
                copy.set_types(
                    ["int8", "int8", "int4", "text", "int4", "int4", "int4", "int4", "jsonb"]
                )
                for prepared in documents:
                    document_id = prepared.document.pk
                    for ordinal, draft in enumerate(prepared.drafts):
                        chunk_id = next(chunk_ids)
                        copy.write_row(
                            (
                                chunk_id,
                                document_id,
                                ordinal,
                                draft.text,
                                draft.token_count,
                                draft.char_start,
                                draft.char_end,
                                draft.page,
                                Jsonb(list(draft.heading_path)),
                            )
                        )
                        counts = chunk_terms(draft.text)
                        length = sum(counts.values())
                        indexed.append((chunk_id, length))
                        postings += [
                            (term, chunk_id, document_id, tf, length) for term, tf in counts.items()
                        ]
                        self._deltas.df.update(counts.keys())
                        self._deltas.add_chunk(document_id, length)
            with raw.copy(
                "COPY retrieval_indexedchunk (chunk_id, length) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["int8", "int4"])
                for row in indexed:
                    copy.write_row(row)
            with raw.copy(
                f"COPY {POSTING} (term, chunk_id, document_id, tf, length)"
                " FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "int8", "int8", "int4", "int4"])
                for posting in postings:
                    copy.write_row(posting)
            # What store() leaves on a document it filled (its progress and status).
            Document.objects.filter(pk__in=[prepared.document.pk for prepared in documents]).update(
                status=Document.Status.READY, progress=100, error=""
            )
        self.num_chunks += num_chunks
        self.num_postings += len(postings)

    def finish(self) -> None:
        """Add the statistics, build the postings' key and indexes again, ANALYZE."""
        with transaction.atomic():
            self._deltas.apply()
        with connection.cursor() as cursor:
            # NOTE: a sort of tens of millions of postings; with the default 64 MB it spills
            # to many more temporary runs and takes several times longer.
            cursor.execute("SET maintenance_work_mem = '1GB'")
            for name, definition in self._constraints:
                logger.warning("bulk load: adding %s (%s)", name, definition)
                cursor.execute(f'ALTER TABLE {POSTING} ADD CONSTRAINT "{name}" {definition}')
            for definition in self._indexes:
                logger.warning("bulk load: %s", definition)
                cursor.execute(definition)
            cursor.execute("RESET maintenance_work_mem")
        self._started = False
        analyze_tables()
        logger.warning(
            "bulk load: %d chunks, %d postings (%d chunks in the table)",
            self.num_chunks,
            self.num_postings,
            Chunk.objects.count(),
        )
