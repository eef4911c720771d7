"""Where the dense vectors live: one interface, two stores, chosen when the retriever is built.

- `faiss` (`retrieval.index.VectorIndex`): a faiss file in the data dir, loaded whole into every
  process, changed under a file lock right after the chunks' transaction commits; start-up
  repair (`retrieval.consistency`) mends what a crash between the two left.
- `pgvector` (`retrieval.pgvector_store.PgVectorStore`): an `embedding` column on the chunk rows
  with an HNSW index, written in the chunks' own transaction (`in_database`), so the index and
  the database cannot disagree; the collection and status filter is part of the search query.

Which one a process uses is decided when its retriever is built (`retrieval.vector_store_choice`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class UnreadableIndexError(Exception):
    """The stored vectors cannot be used as they are (corrupt, or another embedding model's)."""


class VectorStoreUnavailable(Exception):
    """The store could not answer (its database is down or restarting); nothing was changed."""


class VectorStore(Protocol):
    """Chunk id -> unit vector, with the embedding model that made them recorded beside them."""

    name: str
    dimension: int
    embedding_model: str
    # True: writes join the caller's database transaction (ingestion writes the vectors in the
    # chunks' transaction). False: the caller writes them after its transaction commits.
    in_database: bool
    # Why this store was chosen (`choose_vector_store`), for /healthz.
    reason: str

    def replace(self, remove_ids: list[int], ids: list[int], vectors: np.ndarray) -> None:
        """Remove `remove_ids` and store `vectors` under `ids`, as one change."""
        ...

    def remove(self, ids: list[int]) -> None: ...

    def reset(self, ids: list[int], vectors: np.ndarray) -> None:
        """Hold exactly these vectors (a rebuild)."""
        ...

    def ids(self) -> set[int]:
        """The ids that have a vector; raises UnreadableIndexError for an unusable store."""
        ...

    def verify(self) -> None:
        """Raise UnreadableIndexError unless the stored vectors can be searched as they are."""
        ...

    def recorded_model(self) -> str | None:
        """The embedding model recorded as having made the vectors; None without a record."""
        ...

    def set_aside(self, suffix: str) -> str:
        """Put unusable vectors out of the way (to rebuild from the chunks); says where."""
        ...

    def __len__(self) -> int: ...

    def search(
        self,
        query: np.ndarray,
        limit: int,
        allowed_ids: np.ndarray | None = None,
        collection_ids: list[int] | None = None,
    ) -> list[tuple[int, float]]:
        """(chunk id, cosine) best first. `allowed_ids` (chunk ids) and `collection_ids` (None:
        all) say the same thing; each store filters by the one it can."""
        ...

    def describe(self) -> str:
        """Which store this is and where, for /healthz."""
        ...
