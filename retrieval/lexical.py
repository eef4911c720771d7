"""BM25 over the chunk texts with bm25s, on the terms of `retrieval.analyzer` (Chinese
segmented, compounds such as `0.88` and `apt-get` kept).

The index lives in memory and is rebuilt from the database when the set of chunks changed (a
cheap count + max-id + checksum query tells). At 10,000 chunks a rebuild takes about a second.
"""

from __future__ import annotations

import logging
import threading

import bm25s
import numpy as np

from retrieval.analyzer import analyze

logger = logging.getLogger(__name__)

# bm25s's defaults, named because the PostgreSQL store (retrieval.lexical_postgres) must score
# with the same ones.
K1 = 1.5
B = 0.75
METHOD = "lucene"


class LexicalIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._retriever: bm25s.BM25 | None = None
        self._chunk_ids = np.zeros(0, dtype=np.int64)
        self._stamp: object = None

    def build(self, chunk_ids: list[int], texts: list[str], stamp: object = None) -> None:
        retriever = bm25s.BM25(k1=K1, b=B, method=METHOD)
        if texts:
            retriever.index([analyze(text) for text in texts], show_progress=False)
        with self._lock:
            self._retriever = retriever if texts else None
            self._chunk_ids = np.asarray(chunk_ids, dtype=np.int64)
            self._stamp = stamp

    @property
    def stamp(self) -> object:
        return self._stamp

    def search(
        self, query: str, limit: int, allowed_ids: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        """(chunk id, BM25 score) best first, only positive scores."""
        with self._lock:
            retriever, chunk_ids = self._retriever, self._chunk_ids
        if retriever is None or limit <= 0:
            return []
        terms = analyze(query)
        if not terms:
            return []
        mask = None
        if allowed_ids is not None:
            mask = np.isin(chunk_ids, allowed_ids).astype(np.float32)
            if not mask.any():
                return []
        k = min(limit, len(chunk_ids))
        positions, scores = retriever.retrieve(
            [terms], k=k, show_progress=False, weight_mask=mask, n_threads=1
        )
        return [
            (int(chunk_ids[p]), float(s))
            for p, s in zip(positions[0], scores[0], strict=False)
            if s > 0
        ]
