"""Where BM25 runs: one interface, two stores, chosen when the retriever is built.

- `InProcessLexicalStore` (`bm25s`): bm25s in this process's memory, rebuilt from the chunks
  whenever the set of ready chunks changed (~1.4 s per 10,000 chunks). SQLite's choice.
- `PostgresLexicalStore` (`postgresql`, `retrieval.lexical_postgres`): an inverted index in
  PostgreSQL, kept up to date per document in the chunks' own transaction
  (`retrieval.postings`), scored in one query. PostgreSQL's choice.

`CACHET_LEXICAL_STORE` overrides `auto`. Both give the same BM25 scores: bm25s's default
("lucene": idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf / (tf + k1 (1 - b + b dl / avgdl)),
k1 = 1.5, b = 0.75), each query term counted as often as the query repeats it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import numpy as np
from django.conf import settings
from django.db import connection
from django.db.models import Max, Min

from retrieval.lexical import LexicalIndex
from retrieval.models import Chunk, Document

logger = logging.getLogger(__name__)

STORE_NAMES = ("bm25s", "postgresql")


class LexicalStore(Protocol):
    name: str

    def search(
        self,
        query: str,
        limit: int,
        *,
        allowed_ids: np.ndarray | None = None,
        collection_ids: list[int] | None = None,
    ) -> list[tuple[int, float]]:
        """(chunk id, BM25 score) best first, positive scores only, of ready documents.

        `collection_ids` (None: all) and `allowed_ids` (the chunk ids of those collections,
        None: all) say the same thing; each store uses the one it filters by. Raises
        `unreachable_database.LexicalStoreUnavailable` when a store in PostgreSQL cannot
        reach it.
        """
        ...

    def describe(self) -> str:
        """One line for /healthz."""
        ...


class InProcessLexicalStore:
    """bm25s over the ready chunks, rebuilt in this process when they changed."""

    name = "bm25s"

    def __init__(self) -> None:
        self.index = LexicalIndex()
        self._lock = threading.Lock()

    def search(
        self,
        query: str,
        limit: int,
        *,
        allowed_ids: np.ndarray | None = None,
        collection_ids: list[int] | None = None,
    ) -> list[tuple[int, float]]:
        self.refresh()
        return self.index.search(query, limit, allowed_ids)

    def refresh(self) -> None:
        stamp = _ready_chunks_stamp()
        if stamp == self.index.stamp:
            return
        with self._lock:
            if stamp == self.index.stamp:
                return
            started = time.perf_counter()
            rows = list(
                Chunk.objects.filter(document__status=Document.Status.READY)
                .order_by("id")
                .values_list("id", "text")
            )
            self.index.build([r[0] for r in rows], [r[1] for r in rows], stamp)
            logger.info(
                "BM25 index rebuilt over %d chunks in %.2fs",
                len(rows),
                time.perf_counter() - started,
            )

    def describe(self) -> str:
        stamp = self.index.stamp
        built = f"{stamp[0]} chunks" if isinstance(stamp, tuple) else "not built yet"
        return f"bm25s in this process ({built})"


def _ready_chunks_stamp() -> tuple[int, int | None, int | None]:
    """Changes whenever the set of ready chunks does (chunk ids only grow)."""
    ready = Chunk.objects.filter(document__status=Document.Status.READY)
    stats = ready.aggregate(low=Min("id"), high=Max("id"))
    return (ready.count(), stats["low"], stats["high"])


def lexical_store_name(configured: str | None = None) -> str:
    """The store `CACHET_LEXICAL_STORE` (or `configured`) selects on this database."""
    name = configured or settings.CACHET_LEXICAL_STORE
    if name == "auto":
        return "postgresql" if connection.vendor == "postgresql" else "bm25s"
    if name not in STORE_NAMES:
        raise ValueError(f"unknown lexical store {name!r}; expected auto or one of {STORE_NAMES}")
    if name == "postgresql" and connection.vendor != "postgresql":
        raise ValueError("the postgresql lexical store needs a PostgreSQL database")
    return name


def make_lexical_store(configured: str | None = None) -> LexicalStore:
    name = lexical_store_name(configured)
    if name == "postgresql":
        from retrieval.lexical_postgres import PostgresLexicalStore

        return PostgresLexicalStore()
    return InProcessLexicalStore()
