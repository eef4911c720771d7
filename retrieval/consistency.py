"""Keeping the faiss index and the Chunk table in step: repair at start-up, full rebuild."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol

from django.db.models import QuerySet

from retrieval.embeddings import Embedder
from retrieval.index import UnreadableIndexError, VectorIndex
from retrieval.models import Chunk, Document

logger = logging.getLogger(__name__)

EMBED_BATCH = 512


@dataclass(slots=True)
class RepairReport:
    removed: int
    added: int
    rebuilt: bool = False


class IndexedRetriever(Protocol):
    """What repair needs of a `retrieval.search.Retriever`: its vector index and its embedder.

    NOTE: a protocol, not the class: search.py builds its retriever by repairing it here.
    """

    embedder: Embedder
    vectors: VectorIndex


def _ready_chunks() -> QuerySet[Chunk]:
    return Chunk.objects.filter(document__status=Document.Status.READY)


def _embed_and_add(retriever: IndexedRetriever, chunk_ids: list[int]) -> None:
    for start in range(0, len(chunk_ids), EMBED_BATCH):
        batch = chunk_ids[start : start + EMBED_BATCH]
        rows = dict(_ready_chunks().filter(id__in=batch).values_list("id", "text"))
        ids = [i for i in batch if i in rows]
        retriever.vectors.replace([], ids, retriever.embedder.encode([rows[i] for i in ids]))


def repair_index(retriever: IndexedRetriever) -> RepairReport:
    """Remove vectors without a ready chunk, embed ready chunks without a vector.

    An index file that cannot be read (corrupt, truncated, another model's dimension) or whose
    vector data is damaged (`VectorIndex.verify`) is moved aside and rebuilt from the database.
    """
    in_database = set(_ready_chunks().values_list("id", flat=True))
    try:
        in_index = retriever.vectors.ids()
        retriever.vectors.verify()
    except UnreadableIndexError as error:
        aside = retriever.vectors.path.with_name(
            f"{retriever.vectors.path.name}.unreadable-{int(time.time())}"
        )
        retriever.vectors.path.replace(aside)
        logger.error("%s; moved it to %s and rebuilding the index", error, aside)
        count = rebuild_index(retriever)
        return RepairReport(removed=0, added=count, rebuilt=True)
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
    """Re-embed every ready chunk into a fresh index; returns the number of vectors."""
    import numpy as np

    ids = list(_ready_chunks().order_by("id").values_list("id", flat=True))
    vectors = []
    for start in range(0, len(ids), EMBED_BATCH):
        batch = ids[start : start + EMBED_BATCH]
        rows = dict(_ready_chunks().filter(id__in=batch).values_list("id", "text"))
        vectors.append(retriever.embedder.encode([rows[i] for i in batch]))
    matrix = (
        np.concatenate(vectors) if vectors else np.zeros((0, retriever.embedder.dimension), "f4")
    )
    retriever.vectors.reset(ids, matrix)
    logger.info("search index rebuilt: %d vectors", len(ids))
    return len(ids)
