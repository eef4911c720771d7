"""Carrying an existing faiss index into PostgreSQL (pgvector) without re-embedding.

A deployment that moves to PostgreSQL with pgvector starts with an empty embedding column, and
start-up would embed every chunk again (minutes to hours). `manage.py import_faiss_index` copies
the vectors of the faiss file instead, before or after the switch: only vectors of the configured
embedding model (the file's record says which made them), only for chunks that exist and are
ready, in batches of one transaction each, so it can be stopped and run again. Chunks the file
has no vector for are embedded by the next start-up's repair (`retrieval.consistency.sync_ids`).
A first start on pgvector that finds the column empty and the faiss file still there imports it
by itself (`import_left_faiss_index`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval.index import VectorIndex
from retrieval.models import Chunk, Document
from retrieval.vector_store import UnreadableIndexError, VectorStore

logger = logging.getLogger(__name__)

BATCH = 1000


@dataclass(slots=True)
class ImportReport:
    imported: int
    without_chunk: int  # vectors of chunks that are gone or not ready: left out
    still_missing: int  # ready chunks without a vector afterwards


def import_left_faiss_index(path: Path, target: VectorStore) -> ImportReport | None:
    """At start-up on pgvector with an empty column: the vectors a faiss index left behind (a
    deployment moved to pgvector without `import_faiss_index`), copied in instead of embedded.

    The file is then moved aside (`<name>.imported-<time>`), so that it is read once. A file that
    cannot be used is left where it is, and start-up embeds the chunks as it would without it.
    """
    if not target.in_database or not path.is_file() or len(target) > 0:
        return None
    try:
        report = import_faiss_index(path, target)
    except UnreadableIndexError as error:
        logger.warning("not importing %s (%s); embedding the chunks instead", path, error)
        return None
    source = VectorIndex(path, target.dimension, target.embedding_model)
    aside = source.set_aside(f"imported-{int(time.time())}")
    logger.warning(
        "imported %d vectors from the faiss index into %s instead of embedding them again; "
        "the file is now %s",
        report.imported,
        target.describe(),
        aside,
    )
    return report


def import_faiss_index(path: Path, target: VectorStore) -> ImportReport:
    """Copy the vectors of the faiss file at `path` into `target` (a database store).

    Raises UnreadableIndexError for a file that cannot be used: unreadable, damaged, another
    dimension, or made by another embedding model than `target`'s.
    """
    if not path.is_file():
        raise UnreadableIndexError(f"there is no faiss index at {path}")
    source = VectorIndex(path, target.dimension, target.embedding_model)
    recorded = source.recorded_model()
    if recorded is None:
        raise UnreadableIndexError(
            f"{path} does not record its embedding model, so its vectors cannot be vouched for "
            f"as {target.embedding_model!r}'s; start-up will embed the chunks instead"
        )
    source.verify()  # NOTE: also refuses another model's file and another dimension
    ids, vectors = source.items()
    ready = set(
        Chunk.objects.filter(document__status=Document.Status.READY).values_list("id", flat=True)
    )
    keep = np.fromiter((int(i) in ready for i in ids), dtype=bool, count=len(ids))
    ids, vectors = ids[keep], vectors[keep]
    for start in range(0, len(ids), BATCH):
        target.replace([], ids[start : start + BATCH].tolist(), vectors[start : start + BATCH])
        logger.info(
            "imported %d of %d vectors from %s", min(start + BATCH, len(ids)), len(ids), path
        )
    report = ImportReport(
        imported=len(ids),
        without_chunk=int((~keep).sum()),
        still_missing=len(ready - target.ids()),
    )
    return report
