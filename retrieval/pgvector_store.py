"""Vectors in PostgreSQL with pgvector: an `embedding` column on the chunk rows, an HNSW index.

Writes go through Django's connection, so they join the caller's transaction: ingestion stores a
document's chunks and their vectors in one transaction (`retrieval.ingest`), and deleting a
chunk row deletes its vector. The search is one query: the HNSW scan ordered by inner product
(the embeddings are unit vectors, as in the faiss store), joined to the documents for the
status and collection filter, with pgvector 0.8's iterative index scan so that a narrow filter
still fills `limit` rows instead of returning the few of the first `ef_search` candidates.

NOTE: the schema is created here, at start-up, not by a Django migration. The column's type
names the dimension (`vector(384)`), which comes from the embedding model configured when the
process starts, not from code; a model of another dimension needs the column made again
(`set_aside`). And a migration made conditional on the extension would run once, as a no-op, on
a database where pgvector was installed later, and never again: the store would find no column.
Done at start (idempotent, under an advisory lock so that processes starting together do not
race), the column follows the configuration and the extension, and SQLite or PostgreSQL without
pgvector never see it. Django does not know the column, so its ORM reads and writes of chunks
leave it alone (every query names its columns).

`retrieval_vector_store` holds one row: the embedding model that made the vectors and their
dimension, written in the same transaction as the column is (re)made.

A chunk row also carries its document's collection (`collection_id`, kept by two triggers, so
every writer, COPY and the ORM included, and a document moved to another collection keep it
true) for one reason: a large collection gets an HNSW index of its own, partial on that column
(`retrieval.collection_indexes`), and a search confined to it scans that graph instead of
filtering the whole table's, whose recall a filter admitting 5-10% of a million chunks held near
0.9 whatever `ef_search`. The search still filters on the document's collection, so a stale
value could cost recall, never show a chunk to a reader of the wrong collection.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
from django.db import connections, transaction

from retrieval.unreachable_database import reported_as
from retrieval.vector_store import UnreadableIndexError, VectorStoreUnavailable

logger = logging.getLogger(__name__)

TABLE = "retrieval_chunk"
COLUMN = "embedding"
INDEX = "retrieval_chunk_embedding_hnsw"
# The ids of the chunks that have a vector: `len()` (/healthz) and `ids()` (start-up's check)
# read this small index instead of every row's 1.5 kB vector (the whole table, at scale).
IDS_INDEX = "retrieval_chunk_embedding_ids"
# Each chunk's document's collection, and the prefix of the collections' own partial HNSW
# indexes (`retrieval_chunk_embedding_hnsw_c<collection id>`; see `retrieval.collection_indexes`).
COLLECTION_COLUMN = "collection_id"
COLLECTION_INDEX_PREFIX = "retrieval_chunk_embedding_hnsw_c"
# (trigger, its function, the function's body, when it fires): the chunk takes its document's
# collection when written, and a document's chunks follow it to another collection.
_COLLECTION_TRIGGERS = (
    (
        "retrieval_chunk_collection",
        "retrieval_chunk_set_collection",
        f"NEW.{COLLECTION_COLUMN} := (SELECT collection_id FROM retrieval_document "
        "WHERE id = NEW.document_id); RETURN NEW;",
        f"BEFORE INSERT OR UPDATE OF document_id ON {TABLE} FOR EACH ROW",
    ),
    (
        "retrieval_document_collection",
        "retrieval_document_move_chunks",
        f"UPDATE {TABLE} SET {COLLECTION_COLUMN} = NEW.collection_id "
        "WHERE document_id = NEW.id; RETURN NULL;",
        "AFTER UPDATE OF collection_id ON retrieval_document FOR EACH ROW "
        "WHEN (OLD.collection_id IS DISTINCT FROM NEW.collection_id)",
    ),
)
STATE_TABLE = "retrieval_vector_store"
# Any constant the processes share: pg_advisory_xact_lock's key for schema changes.
SCHEMA_LOCK_KEY = 0x43414348  # "CACH"
# HNSW's candidate list per search (pgvector's default is 40): at least the rows asked of the
# index scan, as one scan step cannot return more than this. Measured at 1,000,000 chunks
# (bench.vector_store, README "Vector stores"): recall@10 0.889 at 100 (some queries found none
# of their 10), 0.933-0.969 at 200 over three index builds, 0.962-0.967 at 400, 0.975 at 1000;
# p50 17 -> 25-32 -> 34-41 -> 66 ms. One collection of 100,000 through its own index: 0.933-0.935
# at 200, 0.964 at 400 (47 ms), 0.979 at 800 (79 ms).
EF_SEARCH = 400
# Rows taken from the index scan per row returned (see `search_query`).
OVERFETCH = 4
# A filter admitting at most this many chunks is searched exactly, not through the index (see
# `reads_exactly`); 0: never. At 1,000,000 chunks, one collection's 50,000 took 69 ms at p50
# (p95 78) with recall@10 1.0, against ~93 ms and 0.70 through the index; 100,000 took 204 ms
# (bench.vector_store on the Xeon, README "Vector stores").
EXACT_ROWS = 50_000
WRITE_BATCH = 1000
_VECTOR_TYPE = re.compile(r"^vector\((\d+)\)$")


class SearchQuery(NamedTuple):
    """One query of a search, and the `hnsw.ef_search` it runs with."""

    sql: str
    params: list[Any]
    ef_search: int


class CollectionIndex(NamedTuple):
    """A collection's own HNSW index, as the catalog shows it."""

    valid: bool  # False: being built concurrently, or left so by a build that failed
    rows: float  # as PostgreSQL last counted them (the build, then VACUUM / ANALYZE)


def collection_indexes(cursor: Any) -> dict[int, CollectionIndex]:
    """Every collection's own HNSW index (`retrieval.collection_indexes`), by collection id."""
    cursor.execute(
        "SELECT c.relname, i.indisvalid AND i.indisready, greatest(c.reltuples, 0) "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = %s::regclass AND starts_with(c.relname, %s)",
        [TABLE, COLLECTION_INDEX_PREFIX],
    )
    found = {}
    for name, valid, rows in cursor.fetchall():
        suffix = name[len(COLLECTION_INDEX_PREFIX) :]
        if suffix.isdigit():
            found[int(suffix)] = CollectionIndex(bool(valid), float(rows))
    return found


def count_chunks(cursor: Any, collection_ids: list[int], stop_at: int) -> int:
    """The chunks of the collections' ready documents, counted up to `stop_at`, through the
    documents' and the chunks' document indexes (a ready document's chunks have their vectors:
    both are written in one transaction)."""
    cursor.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM {TABLE} c "
        "JOIN retrieval_document d ON d.id = c.document_id "
        "WHERE d.status = 'ready' AND d.collection_id = ANY(%s) LIMIT %s) AS counted",
        [[int(c) for c in collection_ids], stop_at],
    )
    return int(cursor.fetchone()[0])


def vector_literal(vector: np.ndarray) -> str:
    """pgvector's text form, '[0.1,0.2,...]' (float32 values survive the round trip)."""
    return "[" + ",".join(map(repr, np.asarray(vector, dtype=np.float32).tolist())) + "]"


class PgVectorStore:
    name = "pgvector"
    in_database = True

    def __init__(
        self,
        dimension: int,
        embedding_model: str,
        *,
        alias: str = "default",
        ef_search: int = EF_SEARCH,
    ) -> None:
        self.dimension = dimension
        self.embedding_model = embedding_model
        self.alias = alias
        self.ef_search = ef_search
        self.exact_rows = EXACT_ROWS
        # False: a collection's own index is never searched (bench.vector_store's `hnsw` plan).
        self.use_collection_indexes = True
        self.reason = ""
        self.ensure_schema()

    # ---- schema ----

    @contextmanager
    def _schema_change(self) -> Iterator[Any]:
        with transaction.atomic(using=self.alias), connections[self.alias].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SCHEMA_LOCK_KEY])
            # NOTE: ALTER TABLE refuses a table with deferred foreign-key checks pending (chunks
            # written earlier in the caller's transaction): check them now.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} ("
                "id smallint PRIMARY KEY CHECK (id = 1), "
                "embedding_model text NOT NULL, dimension integer NOT NULL)"
            )
            yield cursor

    def ensure_schema(self) -> None:
        """Create the column, its index and the model record where they are missing."""
        with self._schema_change() as cursor:
            # NOTE: a no-op where `choose_vector_store` created it (or an administrator did).
            cursor.execute("CREATE EXTENSION IF NOT EXISTS vector")
            if self._column_dimension(cursor) is None:
                self._make_column(cursor)
            self._ensure_collection_column(cursor)
            # NOTE: looked up first: CREATE INDEX IF NOT EXISTS locks the table against writes
            # (and waits for an ingestion's transaction) before it finds the index there.
            for name, definition in self._indexes():
                cursor.execute("SELECT to_regclass(%s)", [name])
                if cursor.fetchone()[0] is None:
                    cursor.execute(f"CREATE INDEX {name} ON {TABLE} {definition}")
            cursor.execute(
                f"INSERT INTO {STATE_TABLE} (id, embedding_model, dimension) VALUES (1, %s, %s) "
                "ON CONFLICT (id) DO NOTHING",
                [self.embedding_model, self.dimension],
            )

    @staticmethod
    def _indexes() -> list[tuple[str, str]]:
        return [
            (INDEX, f"USING hnsw ({COLUMN} vector_ip_ops)"),
            (IDS_INDEX, f"(id) WHERE {COLUMN} IS NOT NULL"),
        ]

    @staticmethod
    def _ensure_collection_column(cursor: Any) -> None:
        """The chunks' collection column (filled in for the rows already there) and the
        triggers that keep it, where missing."""
        cursor.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s "
            "AND NOT attisdropped",
            [TABLE, COLLECTION_COLUMN],
        )
        if cursor.fetchone() is None:
            cursor.execute(f"ALTER TABLE {TABLE} ADD COLUMN {COLLECTION_COLUMN} bigint")
            cursor.execute(
                f"UPDATE {TABLE} AS c SET {COLLECTION_COLUMN} = d.collection_id "
                "FROM retrieval_document d WHERE d.id = c.document_id"
            )
            logger.info("%s.%s added for %d chunks", TABLE, COLLECTION_COLUMN, cursor.rowcount)
        for trigger, function, body, fires in _COLLECTION_TRIGGERS:
            cursor.execute("SELECT 1 FROM pg_trigger WHERE tgname = %s", [trigger])
            if cursor.fetchone() is None:
                cursor.execute(
                    f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger "
                    f"LANGUAGE plpgsql AS $$ BEGIN {body} END $$"
                )
                cursor.execute(f"CREATE TRIGGER {trigger} {fires} EXECUTE FUNCTION {function}()")

    def _column_dimension(self, cursor: Any) -> int | None:
        cursor.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attname = %s AND NOT attisdropped",
            [TABLE, COLUMN],
        )
        row = cursor.fetchone()
        if row is None:
            return None
        match = _VECTOR_TYPE.match(row[0])
        return int(match.group(1)) if match else 0

    def _make_column(self, cursor: Any) -> None:
        cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")
        cursor.execute(f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS {COLUMN}")
        cursor.execute(f"ALTER TABLE {TABLE} ADD COLUMN {COLUMN} vector({self.dimension})")
        for name, definition in self._indexes():  # NOTE: dropping the column dropped them
            cursor.execute(f"CREATE INDEX {name} ON {TABLE} {definition}")
        cursor.execute(
            f"INSERT INTO {STATE_TABLE} (id, embedding_model, dimension) VALUES (1, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET embedding_model = EXCLUDED.embedding_model, "
            "dimension = EXCLUDED.dimension",
            [self.embedding_model, self.dimension],
        )

    def recorded_model(self) -> str | None:
        with connections[self.alias].cursor() as cursor:
            cursor.execute(f"SELECT embedding_model FROM {STATE_TABLE} WHERE id = 1")
            row = cursor.fetchone()
        return row[0] if row else None

    def verify(self) -> None:
        """The record names the configured model and the column has its dimension.

        NOTE: unlike the faiss file, the vectors themselves are not read back and measured: the
        database's own integrity (WAL, checksums) guards them, and reading every vector in every
        process at start-up is what this store is meant to spare at a million chunks.
        """
        recorded = self.recorded_model()
        if recorded != self.embedding_model:
            raise UnreadableIndexError(
                f"the vectors in PostgreSQL were made by the embedding model {recorded!r}, but "
                f"{self.embedding_model!r} is configured"
            )
        with connections[self.alias].cursor() as cursor:
            dimension = self._column_dimension(cursor)
        if dimension != self.dimension:
            raise UnreadableIndexError(
                f"{TABLE}.{COLUMN} holds {dimension}-dimensional vectors but the embedding "
                f"model makes {self.dimension}"
            )

    def set_aside(self, suffix: str) -> str:
        """Drop every vector: the column is made again, empty, for the configured model."""
        with self._schema_change() as cursor:
            self._make_column(cursor)
        return f"the emptied column {TABLE}.{COLUMN} (for {self.embedding_model})"

    # ---- writes (in the caller's transaction, if any) ----

    def replace(self, remove_ids: list[int], ids: list[int], vectors: np.ndarray) -> None:
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids for {len(vectors)} vectors")
        with transaction.atomic(using=self.alias), connections[self.alias].cursor() as cursor:
            if ids:  # NOTE: dropping vectors is right whichever model made them
                self._hold_model(cursor)
            dropped = sorted(set(remove_ids) - set(ids))
            if dropped:
                cursor.execute(
                    f"UPDATE {TABLE} SET {COLUMN} = NULL "
                    f"WHERE id = ANY(%s) AND {COLUMN} IS NOT NULL",
                    [dropped],
                )
            self._write(cursor, ids, vectors)

    def _hold_model(self, cursor: Any) -> None:
        """Check that the column holds this store's model's vectors, and keep it so until the
        transaction ends.

        NOTE: FOR SHARE on the record: a process switching models (`set_aside`, which rewrites
        the record) waits for writes under way, and a write that comes after it finds the new
        model and fails instead of putting one model's vectors among another's.
        """
        cursor.execute(f"SELECT embedding_model FROM {STATE_TABLE} WHERE id = 1 FOR SHARE")
        row = cursor.fetchone()
        recorded = row[0] if row else None
        if recorded != self.embedding_model:
            raise UnreadableIndexError(
                f"the vectors in PostgreSQL are now {recorded!r}'s, not {self.embedding_model!r}'s "
                "(another process switched the embedding model); restart this process"
            )

    def _write(self, cursor: Any, ids: list[int], vectors: np.ndarray) -> None:
        if vectors.ndim != 2 or (len(ids) and vectors.shape[1] != self.dimension):
            raise ValueError(f"expected {self.dimension}-dimensional vectors, got {vectors.shape}")
        for start in range(0, len(ids), WRITE_BATCH):
            batch_ids = [int(i) for i in ids[start : start + WRITE_BATCH]]
            texts = [vector_literal(v) for v in vectors[start : start + WRITE_BATCH]]
            # NOTE: a chunk deleted meanwhile has no row to take its vector: nothing stored.
            cursor.execute(
                f"UPDATE {TABLE} AS c SET {COLUMN} = v.e::vector "
                "FROM unnest(%s::bigint[], %s::text[]) AS v(id, e) WHERE c.id = v.id",
                [batch_ids, texts],
            )

    def remove(self, ids: list[int]) -> None:
        self.replace(ids, [], np.zeros((0, self.dimension), np.float32))

    def reset(self, ids: list[int], vectors: np.ndarray) -> None:
        """Exactly these vectors, in one transaction (searches see the old ones until it ends)."""
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids for {len(vectors)} vectors")
        with transaction.atomic(using=self.alias), connections[self.alias].cursor() as cursor:
            self._hold_model(cursor)
            cursor.execute(f"UPDATE {TABLE} SET {COLUMN} = NULL WHERE {COLUMN} IS NOT NULL")
            self._write(cursor, ids, vectors)

    # ---- reads ----

    def ids(self) -> set[int]:
        with connections[self.alias].cursor() as cursor:
            cursor.execute(f"SELECT id FROM {TABLE} WHERE {COLUMN} IS NOT NULL")
            return {row[0] for row in cursor.fetchall()}

    def __len__(self) -> int:
        with connections[self.alias].cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE {COLUMN} IS NOT NULL")
            return int(cursor.fetchone()[0])

    def search(
        self,
        query: np.ndarray,
        limit: int,
        allowed_ids: np.ndarray | None = None,
        collection_ids: list[int] | None = None,
    ) -> list[tuple[int, float]]:
        """(chunk id, cosine) best first among ready documents of `collection_ids` (None: all).

        `allowed_ids` is not needed: the collection filter is part of this query. Raises
        VectorStoreUnavailable when PostgreSQL does not answer (restarting, unreachable).
        """
        if limit <= 0 or (collection_ids is not None and not collection_ids):
            return []
        with (
            reported_as(VectorStoreUnavailable, "vector search", self.alias),
            transaction.atomic(using=self.alias),
            connections[self.alias].cursor() as cursor,
        ):
            self.configure_search(cursor, limit)
            ef_search = self.configured_ef_search(limit)
            rows = []
            for search in self.search_queries(cursor, query, limit, collection_ids):
                if search.ef_search != ef_search:
                    ef_search = search.ef_search
                    cursor.execute(
                        "SELECT set_config('hnsw.ef_search', %s, true)", [str(ef_search)]
                    )
                cursor.execute(search.sql, search.params)
                rows += cursor.fetchall()
        # NOTE: one query's rows per collection with an index of its own: merged best first.
        rows.sort(key=lambda row: (-row[1], row[0]))
        return [(int(i), float(s)) for i, s in rows[:limit]]

    def search_queries(
        self, cursor: Any, query: np.ndarray, limit: int, collection_ids: list[int] | None
    ) -> list[SearchQuery]:
        """The search's queries: one per collection of `collection_ids` that has an HNSW index
        of its own (`retrieval.collection_indexes`), one for the rest, read exactly where they
        are few (`reads_exactly`), else through the whole table's index.

        NOTE: the collections' own graphs share the search's `ef_search` between them (each
        at least the rows it fetches): merging several graphs' candidates already finds more.
        At 1,000,000 chunks in 10 collections (bench.vector_store, README "Vector stores"),
        three collections at 200 each took 76 ms with recall@10 0.987, at 400 each 134 ms.

        NOTE: collections with their own index that hold half the table's rows or more (as
        PostgreSQL last counted) are searched through the whole table's index instead, as one:
        a filter that admits most rows costs a graph search little recall, and one query costs
        less than several.
        """
        configured = self.configured_ef_search(limit)
        if collection_ids is None:
            return [SearchQuery(*self.search_query(query, limit, None), configured)]
        indexed = self.collections_with_own_index(cursor) if self.use_collection_indexes else {}
        own = {c: rows for c, rows in indexed.items() if c in set(collection_ids)}
        if own and 2 * sum(own.values()) >= self._table_rows(cursor) > 0:
            own = {}
        shared = max(OVERFETCH * limit, self.ef_search // max(len(own), 1))
        queries = [
            SearchQuery(*self.search_query(query, limit, [c], own_index=True), ef_search=shared)
            for c in sorted(own)
        ]
        rest = [c for c in collection_ids if c not in own]
        if rest:
            exact = self.reads_exactly(cursor, rest)
            queries.append(
                SearchQuery(*self.search_query(query, limit, rest, exact=exact), configured)
            )
        return queries

    @staticmethod
    def collections_with_own_index(cursor: Any) -> dict[int, float]:
        """The collections whose own HNSW index is built and valid (one being built
        concurrently, or left invalid by a failed build, is not), with the rows it held when
        last counted (PostgreSQL's statistics: the build's count, then ANALYZE's)."""
        return {c: index.rows for c, index in collection_indexes(cursor).items() if index.valid}

    @staticmethod
    def _table_rows(cursor: Any) -> float:
        """The chunk rows as PostgreSQL last counted them (ANALYZE, autovacuum); -1 unknown."""
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [TABLE])
        return float(cursor.fetchone()[0])

    def configure_search(self, cursor: Any, limit: int) -> None:
        """The search's settings, for the rest of the cursor's transaction.

        NOTE: sequential scans are off for the search. PostgreSQL prices computing every
        distance far below what it costs (384 floats a row): left to itself, it read and sorted
        the whole table (20,000 chunks: 71 ms at p50, against 6.7 ms through the HNSW index).
        Without a sequential scan a search over everything takes the index; a narrow filter is
        read exactly, through the documents' index (`reads_exactly`; see "Vector stores" under
        "Benchmarks" in the README).
        """
        cursor.execute(
            "SELECT set_config('hnsw.ef_search', %s, true), "
            "set_config('hnsw.iterative_scan', 'relaxed_order', true), "
            "set_config('enable_seqscan', 'off', true)",
            [str(self.configured_ef_search(limit))],
        )

    def configured_ef_search(self, limit: int) -> int:
        """`hnsw.ef_search` for one graph search of `limit` rows: one scan step returns at most
        that many candidates, so at least the rows fetched."""
        return max(self.ef_search, OVERFETCH * limit)

    def reads_exactly(self, cursor: Any, collection_ids: list[int] | None) -> bool:
        """Whether the collections' chunks are few enough (`exact_rows`) to score them all.

        NOTE: at 100,000 chunks in 20 collections, one collection's 5,000 chunks scored exactly
        took 23.5 ms at p50 with recall@10 1.0; the HNSW index with the filter, which PostgreSQL
        chose, 52 ms with recall 0.89, and 0.91 at ef_search 800 (the filtered rows' neighbours
        are not all reachable from the query's region of the graph). An exact read costs the
        pages the collection's chunks lie on, and a document's chunks are written together, so
        they share pages: 50,000 of a million in documents of 100 took 69 ms. The count stops
        at `exact_rows` + 1, so a wide filter costs a few milliseconds more, not a scan.
        """
        if collection_ids is None or self.exact_rows <= 0:
            return False
        return count_chunks(cursor, collection_ids, self.exact_rows + 1) <= self.exact_rows

    def search_query(
        self,
        query: np.ndarray,
        limit: int,
        collection_ids: list[int] | None,
        *,
        exact: bool = False,
        own_index: bool = False,
    ) -> tuple[str, list[Any]]:
        """The search's SQL and parameters (EXPLAIN shows its plan); `exact` scores every row
        the filter admits, in an order the HNSW index cannot give, so it is never used;
        `own_index`: the one collection of `collection_ids` is searched through its own index."""
        literal = vector_literal(query.reshape(-1))
        where = "d.status = 'ready'"
        params: list[Any] = [literal]
        if collection_ids is not None:
            where += " AND d.collection_id = ANY(%s)"
            params.append([int(c) for c in collection_ids])
        if own_index:
            if collection_ids is None or len(collection_ids) != 1:
                raise ValueError("own_index searches exactly one collection")
            # NOTE: a literal, not a parameter: the planner takes a partial index only where the
            # query's WHERE proves the index's predicate, which a server-side parameter cannot.
            where += f" AND c.{COLLECTION_COLUMN} = {int(collection_ids[0])}"
        if exact:
            sql = (
                f"SELECT c.id, -(c.{COLUMN} <#> %s::vector) AS score FROM {TABLE} c "
                "JOIN retrieval_document d ON d.id = c.document_id "
                f"WHERE {where} AND c.{COLUMN} IS NOT NULL ORDER BY score DESC, c.id LIMIT %s"
            )
            return sql, [*params, limit]
        params += [literal, OVERFETCH * limit, limit]
        # NOTE: relaxed_order lets the iterative scan return rows slightly out of distance order
        # (faster than strict_order). The inner query takes OVERFETCH times `limit` rows and the
        # outer one the best `limit` of them, in exact order: on the HNSW path, with a 1-in-20
        # filter at 20,000 chunks, filtered recall@10 went from 0.88 (LIMIT 10 inside) to 0.99.
        sql = (
            "SELECT id, score FROM ("
            f"SELECT c.id, -(c.{COLUMN} <#> %s::vector) AS score FROM {TABLE} c "
            "JOIN retrieval_document d ON d.id = c.document_id "
            f"WHERE {where} ORDER BY c.{COLUMN} <#> %s::vector LIMIT %s"
            ") AS hits ORDER BY score DESC, id LIMIT %s"
        )
        return sql, params

    def vectors_of(self, ids: list[int]) -> dict[int, np.ndarray]:
        """The stored vectors of `ids` (those that have one)."""
        with connections[self.alias].cursor() as cursor:
            cursor.execute(
                f"SELECT id, {COLUMN}::real[] FROM {TABLE} "
                f"WHERE id = ANY(%s) AND {COLUMN} IS NOT NULL",
                [[int(i) for i in ids]],
            )
            return {row[0]: np.asarray(row[1], dtype=np.float32) for row in cursor.fetchall()}

    def describe(self) -> str:
        return f"pgvector: {TABLE}.{COLUMN} with HNSW index {INDEX}, in PostgreSQL"
