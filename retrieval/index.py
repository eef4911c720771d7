"""The faiss vector index: inner product over unit vectors, vector id = Chunk primary key.

Persisted as one file in the data dir. The web server and the Celery workers are separate
processes, so every change happens under an exclusive file lock: reload from disk, change, write
to a temporary file and rename. Readers reload when the file changed since they last read it.

Beside the index, `<index>.model` records which embedding model made its vectors: two models'
vectors are not comparable even when their dimensions agree (all-MiniLM-L6-v2 and
multilingual-e5-small both make 384), so an index made by another model than the configured one
is refused like a corrupt one, and start-up re-embeds it (`retrieval.consistency`). The record is
written after the index, so a crash between the two leaves an index that is re-embedded once
more, never one that passes as another model's.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import faiss
import numpy as np

from retrieval.vector_store import UnreadableIndexError

logger = logging.getLogger(__name__)

# How far from 1 a stored vector's length may be (float32 rounding of normalised embeddings is
# ~1e-7; bf16 embeddings ~1e-3).
UNIT_TOLERANCE = 1e-2


__all__ = ["UnreadableIndexError", "VectorIndex"]


class VectorIndex:
    """The faiss store (`retrieval.vector_store.VectorStore`)."""

    name = "faiss"
    # NOTE: a file, not the database: written after the chunks' transaction commits.
    in_database = False

    def __init__(self, path: Path, dimension: int, embedding_model: str) -> None:
        self.reason = ""
        self.path = Path(path)
        self.dimension = dimension
        self.embedding_model = embedding_model
        self.model_record = self.path.with_name(f"{self.path.name}.model")
        self._lock_path = self.path.with_suffix(".lock")
        self._thread_lock = threading.RLock()
        self._index = self._empty()
        self._loaded_stamp: tuple[int, int] | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _empty(self) -> faiss.IndexIDMap2:
        return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dimension))

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        return (stat.st_mtime_ns, stat.st_size)

    def _refresh(self) -> None:
        stamp = self._stamp()
        if stamp == self._loaded_stamp:
            return
        if stamp is None:
            self._index = self._empty()
        else:
            try:
                index = faiss.read_index(str(self.path))
            except RuntimeError as error:
                raise UnreadableIndexError(
                    f"{self.path} is not a readable faiss index ({error}); "
                    "run `manage.py rebuild_index`"
                ) from None
            if index.d != self.dimension:
                raise UnreadableIndexError(
                    f"{self.path} holds {index.d}-dimensional vectors but the embedding model "
                    f"makes {self.dimension}; run `manage.py rebuild_index`"
                )
            self._check_model()
            self._index = index
        self._loaded_stamp = stamp

    def recorded_model(self) -> str | None:
        """The embedding model the record names; None without a readable record."""
        try:
            record = json.loads(self.model_record.read_text())
        except (FileNotFoundError, ValueError):
            return None
        model = record.get("embedding_model") if isinstance(record, dict) else None
        return model if isinstance(model, str) else None

    def _check_model(self) -> None:
        recorded = self.recorded_model()
        if recorded is None:
            # NOTE: an index written before the record existed: it can only have been made by
            # the model configured then; the next write records the configured one.
            logger.warning(
                "%s does not record its embedding model; assuming %s",
                self.path,
                self.embedding_model,
            )
        elif recorded != self.embedding_model:
            raise UnreadableIndexError(
                f"{self.path} was made by the embedding model {recorded!r}, but "
                f"{self.embedding_model!r} is configured; run `manage.py rebuild_index`"
            )

    def _record_model(self) -> None:
        if self.recorded_model() == self.embedding_model:
            return
        temporary = self.model_record.with_name(f"{self.model_record.name}.tmp{os.getpid()}")
        record = {"embedding_model": self.embedding_model, "dimension": self.dimension}
        temporary.write_text(json.dumps(record))
        os.replace(temporary, self.model_record)

    def set_aside(self, suffix: str) -> str:
        """Move the index file (and its model record) out of the way; returns where it went."""
        with self._thread_lock, open(self._lock_path, "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                aside = self.path.with_name(f"{self.path.name}.{suffix}")
                if self.path.exists():
                    self.path.replace(aside)
                if self.model_record.exists():
                    self.model_record.replace(aside.with_name(f"{aside.name}.model"))
                self._index = self._empty()
                self._loaded_stamp = None
                return str(aside)
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    @contextmanager
    def _writing(self, *, reload: bool = True) -> Iterator[None]:
        with self._thread_lock, open(self._lock_path, "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                if reload:
                    self._refresh()
                yield
                temporary = self.path.with_suffix(f".tmp{os.getpid()}")
                faiss.write_index(self._index, str(temporary))
                os.replace(temporary, self.path)
                self._record_model()
                self._loaded_stamp = self._stamp()
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def replace(self, remove_ids: list[int], ids: list[int], vectors: np.ndarray) -> None:
        """Remove `remove_ids` and add `vectors` under `ids`, as one change on disk."""
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids for {len(vectors)} vectors")
        with self._writing():
            all_remove = set(remove_ids) | set(ids)
            if all_remove:
                self._index.remove_ids(np.fromiter(all_remove, dtype=np.int64))
            if ids:
                self._index.add_with_ids(
                    np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, np.int64)
                )

    def remove(self, ids: list[int]) -> None:
        self.replace(ids, [], np.zeros((0, self.dimension), np.float32))

    def reset(self, ids: list[int], vectors: np.ndarray) -> None:
        """Replace the whole index (rebuild); works over an unreadable file too."""
        with self._writing(reload=False):
            self._index = self._empty()
            if ids:
                self._index.add_with_ids(
                    np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, np.int64)
                )

    def ids(self) -> set[int]:
        with self._thread_lock:
            self._refresh()
            if self._index.ntotal == 0:
                return set()
            return set(faiss.vector_to_array(self._index.id_map).tolist())

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (ids, vectors) the index holds, in its order (to carry them to another store)."""
        with self._thread_lock:
            self._refresh()
            if self._index.ntotal == 0:
                return np.zeros(0, np.int64), np.zeros((0, self.dimension), np.float32)
            ids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
            return ids, self._index.index.reconstruct_n(0, self._index.ntotal)

    def verify(self) -> None:
        """Raise UnreadableIndexError unless every vector is a finite unit vector.

        faiss reads a file whose vector data was overwritten without complaint; the embeddings
        are L2-normalised, so damaged data shows as vectors off unit length (checked at start).
        """
        with self._thread_lock:
            self._refresh()
            if self._index.ntotal == 0:
                return
            vectors = self._index.index.reconstruct_n(0, self._index.ntotal)
        with np.errstate(over="ignore", invalid="ignore"):  # garbage floats: inf or nan norms
            norms = np.linalg.norm(vectors, axis=1)
        damaged = int(np.count_nonzero(~(np.abs(norms - 1.0) <= UNIT_TOLERANCE)))
        if damaged:
            raise UnreadableIndexError(
                f"{self.path} holds {damaged} vectors that are not unit length (damaged data); "
                "run `manage.py rebuild_index`"
            )

    def __len__(self) -> int:
        with self._thread_lock:
            self._refresh()
            return int(self._index.ntotal)

    def search(
        self,
        query: np.ndarray,
        limit: int,
        allowed_ids: np.ndarray | None = None,
        collection_ids: list[int] | None = None,
    ) -> list[tuple[int, float]]:
        """(chunk id, cosine) best first; `allowed_ids` restricts the search to those ids (the
        chunks of `collection_ids`, which a file of vectors cannot filter by itself)."""
        with self._thread_lock:
            self._refresh()
            if self._index.ntotal == 0 or limit <= 0:
                return []
            params = None
            if allowed_ids is not None:
                if len(allowed_ids) == 0:
                    return []
                params = faiss.SearchParameters(
                    sel=faiss.IDSelectorBatch(np.asarray(allowed_ids, dtype=np.int64))
                )
            scores, ids = self._index.search(
                np.ascontiguousarray(query.reshape(1, -1), dtype=np.float32),
                min(limit, self._index.ntotal),
                params=params,
            )
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=False) if i >= 0]

    def describe(self) -> str:
        return f"faiss: {self.path}"
