"""HNSW indexes of their own for large collections, in pgvector (partial on the chunks' collection).

A search confined to some collections filters the whole table's HNSW graph. Where the filter
admits few chunks the store scores them exactly (`PgVectorStore.reads_exactly`); where it admits
more than that can afford (50,000 of a million took 69 ms, 100,000 took 204) the filtered graph
search held recall@10 near 0.9 at a million chunks whatever `hnsw.ef_search`: the filtered
chunks' nearest neighbours are not all reachable from the query's region of a graph built over
everything. A collection over `OWN_INDEX_ROWS` chunks therefore gets an HNSW index of its own,
`CREATE INDEX ... WHERE collection_id = N`, and a search of it scans that graph, which holds
only its chunks (pgvector's documentation recommends the same: partial indexes for filters on a
few values).

Indexes are built concurrently (writes go on; a search uses an index only once it is valid)
after an ingestion commits (`retrieval.tasks.index_collection`) or by `manage.py
index_collections`, one builder at a time across processes (an advisory lock). A build that
fails leaves an invalid index that searches skip and the next pass drops and builds again; a
collection that shrinks below half the threshold, or is deleted, loses its index.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from retrieval.pgvector_store import (
    COLLECTION_COLUMN,
    COLLECTION_INDEX_PREFIX,
    COLUMN,
    EXACT_ROWS,
    TABLE,
    collection_indexes,
    count_chunks,
)

logger = logging.getLogger(__name__)

# A collection with more chunks (of ready documents) than this gets its own index: past it the store
# would search the collection through the whole table's graph (`EXACT_ROWS`).
OWN_INDEX_ROWS = EXACT_ROWS
# Any constant the processes share: pg_advisory_lock's key for building collection indexes.
BUILD_LOCK_KEY = 0x43414349  # "CACI"
# maintenance_work_mem for a build: the whole graph in memory (~2.5 kB a 384-dimensional
# vector, with room); short of it, pgvector goes on building on disk, several times slower.
BUILD_MEMORY_BYTES_PER_ROW = 4096
MAX_BUILD_MEMORY_MB = 2048


def index_name(collection_id: int) -> str:
    return f"{COLLECTION_INDEX_PREFIX}{int(collection_id)}"


@dataclass
class IndexPass:
    """What one pass did: collections given an index, and those whose index was dropped."""

    built: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)


def update_collection_indexes(
    collection_ids: Iterable[int] | None = None,
    *,
    min_rows: int | None = None,
    wait: bool = True,
    alias: str = "default",
) -> IndexPass | None:
    """Build the indexes that `collection_ids` (None: every collection) lack and drop those no
    longer wanted. Another process's pass goes first: waited for, or with `wait` False, None
    at once (a build can take minutes). Must not run inside a transaction (CREATE INDEX
    CONCURRENTLY cannot). `min_rows`: `OWN_INDEX_ROWS` unless given."""
    min_rows = OWN_INDEX_ROWS if min_rows is None else min_rows
    connection = connections[alias]
    if connection.in_atomic_block:
        raise RuntimeError("collection indexes are built concurrently, outside a transaction")
    done = IndexPass()
    with _build_lock(alias, wait) as cursor:
        if cursor is None:
            return None
        indexes = {c: index.valid for c, index in collection_indexes(cursor).items()}
        cursor.execute("SELECT id FROM retrieval_collection")
        existing = {row[0] for row in cursor.fetchall()}
        wanted = existing if collection_ids is None else existing & set(collection_ids)
        for collection_id in sorted(set(indexes) - existing):  # NOTE: the collection is gone
            _drop(cursor, collection_id)
            done.dropped.append(collection_id)
        for collection_id in sorted(wanted):
            rows = count_chunks(cursor, [collection_id], min_rows + 1)
            valid = indexes.get(collection_id)
            if rows > min_rows and not valid:
                if valid is not None:  # NOTE: left invalid by a build that failed
                    _drop(cursor, collection_id)
                _build(cursor, collection_id, rows)
                done.built.append(collection_id)
            elif rows <= min_rows // 2 and valid is not None:
                _drop(cursor, collection_id)
                done.dropped.append(collection_id)
    return done


@contextmanager
def _build_lock(alias: str, wait: bool) -> Iterator[Any]:
    """A cursor holding the builders' lock for the session, or None where `wait` is False and
    another process holds it."""
    with connections[alias].cursor() as cursor:
        if wait:
            cursor.execute("SELECT pg_advisory_lock(%s)", [BUILD_LOCK_KEY])
        else:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [BUILD_LOCK_KEY])
            if not cursor.fetchone()[0]:
                yield None
                return
        try:
            yield cursor
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [BUILD_LOCK_KEY])


def _build(cursor: Any, collection_id: int, rows: int) -> None:
    name = index_name(collection_id)
    cursor.execute(
        "SELECT setting::bigint / 1024 FROM pg_settings WHERE name = 'maintenance_work_mem'"
    )
    configured_mb = int(cursor.fetchone()[0])
    needed_mb = min(MAX_BUILD_MEMORY_MB, rows * BUILD_MEMORY_BYTES_PER_ROW // 2**20 + 64)
    megabytes = max(configured_mb, needed_mb)
    logger.info(
        "building %s for collection %d (more than %d chunks)", name, collection_id, rows - 1
    )
    cursor.execute(f"SET maintenance_work_mem = '{megabytes}MB'")
    try:
        # NOTE: the same operator class and build settings as the whole table's index.
        cursor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {TABLE} "
            f"USING hnsw ({COLUMN} vector_ip_ops) "
            f"WHERE {COLLECTION_COLUMN} = {int(collection_id)}"
        )
    finally:
        cursor.execute("RESET maintenance_work_mem")
    logger.info("%s built", name)


def _drop(cursor: Any, collection_id: int) -> None:
    name = index_name(collection_id)
    cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    logger.info("%s dropped", name)
