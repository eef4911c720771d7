"""Keeping the vector store and the Chunk table in step: repair at start-up, full rebuild.

A rebuild (a corrupt index, or one made by another embedding model than the configured one: a
deployment that switched models) re-embeds every chunk, minutes for a large knowledge base; its
progress is logged and readable (`rebuild_progress`, shown by /healthz), and meanwhile searches
use BM25 alone (`retrieval.search.Retriever.dense_ready`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
from django.db.models import QuerySet

from retrieval.embedders import TextEmbedder
from retrieval.models import Chunk, Document
from retrieval.vector_store import UnreadableIndexError, VectorStore

logger = logging.getLogger(__name__)

EMBED_BATCH = 512
PROGRESS_LOG_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class RebuildProgress:
    """A rebuild under way in this process."""

    embedding_model: str
    num_embedded: int
    num_chunks: int
    started: float  # time.monotonic()

    def describe(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.num_embedded / elapsed if elapsed > 0 else 0.0
        remaining = (self.num_chunks - self.num_embedded) / rate if rate > 0 else None
        eta = f", about {remaining:.0f} s left" if remaining is not None else ""
        return (
            f"embedding {self.num_embedded} of {self.num_chunks} chunks with "
            f"{self.embedding_model} ({rate:.1f} chunks/s{eta})"
        )


_progress: RebuildProgress | None = None
_progress_lock = threading.Lock()


def rebuild_progress() -> RebuildProgress | None:
    """The rebuild running in this process, if one is."""
    with _progress_lock:
        return _progress


def _set_progress(progress: RebuildProgress | None) -> None:
    global _progress
    with _progress_lock:
        _progress = progress


@dataclass(slots=True)
class RepairReport:
    removed: int
    added: int
    rebuilt: bool = False


class IndexedRetriever(Protocol):
    """What repair needs of a `retrieval.search.Retriever`: its vector store and its embedder.

    NOTE: a protocol, not the class: search.py builds its retriever by repairing it here.
    """

    embedder: TextEmbedder
    vectors: VectorStore


def _ready_chunks() -> QuerySet[Chunk]:
    return Chunk.objects.filter(document__status=Document.Status.READY)


def _embed_and_add(retriever: IndexedRetriever, chunk_ids: list[int]) -> None:
    for start in range(0, len(chunk_ids), EMBED_BATCH):
        batch = chunk_ids[start : start + EMBED_BATCH]
        rows = dict(_ready_chunks().filter(id__in=batch).values_list("id", "text"))
        ids = [i for i in batch if i in rows]
        retriever.vectors.replace([], ids, retriever.embedder.encode([rows[i] for i in ids]))


def set_aside_if_unusable(vectors: VectorStore) -> bool:
    """Set vectors that cannot be used aside; returns whether they were usable.

    Unusable: unreadable (corrupt, truncated, another dimension), damaged vector data
    (`VectorIndex.verify`), or made by another embedding model than the configured one
    (either store: a pgvector column is emptied, a faiss file moved away).
    """
    try:
        vectors.ids()
        vectors.verify()
    except UnreadableIndexError as error:
        aside = vectors.set_aside(f"unusable-{int(time.time())}")
        logger.error("%s; set it aside (%s) and rebuilding the index", error, aside)
        return False
    return True


def repair_index(retriever: IndexedRetriever) -> RepairReport:
    """Remove vectors without a ready chunk, embed ready chunks without a vector; an unusable
    index (`set_aside_if_unusable`) is rebuilt from the database."""
    if not set_aside_if_unusable(retriever.vectors):
        count = rebuild_index(retriever)
        return RepairReport(removed=0, added=count, rebuilt=True)
    return sync_ids(retriever)


def sync_ids(retriever: IndexedRetriever) -> RepairReport:
    """Remove vectors without a ready chunk, embed ready chunks without one (a usable index)."""
    in_database = set(_ready_chunks().values_list("id", flat=True))
    in_index = retriever.vectors.ids()
    extra = sorted(in_index - in_database)
    missing = sorted(in_database - in_index)
    if extra:
        retriever.vectors.remove(extra)
    if missing:
        _embed_and_add(retriever, missing)
    if extra or missing:
        logger.warning(
            "search index repaired: removed %d stale vectors, embedded %d missing chunks",
            len(extra),
            len(missing),
        )
    return RepairReport(removed=len(extra), added=len(missing))


def rebuild_index(retriever: IndexedRetriever) -> int:
    """Re-embed every ready chunk into a fresh index; returns the number of vectors.

    Chunks that became ready or were deleted while it ran are brought in step afterwards (the
    new index replaces the old one whole, written from the chunk list read at the start).
    """
    ids = list(_ready_chunks().order_by("id").values_list("id", flat=True))
    embedded_ids: list[int] = []
    vectors = []
    for batch_ids, batch_vectors in _embed_in_batches(retriever, ids):
        embedded_ids.extend(batch_ids)
        vectors.append(batch_vectors)
    matrix = (
        np.concatenate(vectors) if vectors else np.zeros((0, retriever.embedder.dimension), "f4")
    )
    retriever.vectors.reset(embedded_ids, matrix)
    logger.info(
        "search index rebuilt: %d vectors of %s", len(embedded_ids), retriever.embedder.model_id
    )
    sync_ids(retriever)
    return len(retriever.vectors)


def _embed_in_batches(
    retriever: IndexedRetriever, ids: list[int]
) -> Iterator[tuple[list[int], np.ndarray]]:
    """(ids, vectors) per batch of chunks still ready, with progress kept and logged."""
    progress = RebuildProgress(retriever.embedder.model_id, 0, len(ids), time.monotonic())
    _set_progress(progress)
    last_logged = progress.started
    try:
        for start in range(0, len(ids), EMBED_BATCH):
            batch = ids[start : start + EMBED_BATCH]
            rows = dict(_ready_chunks().filter(id__in=batch).values_list("id", "text"))
            present = [i for i in batch if i in rows]  # NOTE: a chunk deleted meanwhile is skipped
            yield present, retriever.embedder.encode([rows[i] for i in present])
            progress = replace(progress, num_embedded=start + len(batch))
            _set_progress(progress)
            if time.monotonic() - last_logged >= PROGRESS_LOG_SECONDS:
                last_logged = time.monotonic()
                logger.info("rebuilding the search index: %s", progress.describe())
    finally:
        _set_progress(None)
