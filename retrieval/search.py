"""`search()`: dense (faiss) and BM25 candidates, fused, reranked to top-K, permission-filtered."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from django.conf import settings
from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.db.models import Max, Min

from retrieval.embeddings import Embedder, get_embedder
from retrieval.fusion import reciprocal_rank_fusion
from retrieval.index import VectorIndex
from retrieval.lexical import LexicalIndex
from retrieval.models import Chunk, Collection, Document
from retrieval.rerank import Candidate, Reranker, make_reranker

logger = logging.getLogger(__name__)

MODES = ("bm25", "dense", "hybrid", "hybrid+rerank")


@dataclass(slots=True)
class SearchHit:
    """One chunk with its score and what a citation needs."""

    chunk_id: int
    score: float
    text: str
    document_id: int
    document_title: str
    collection_id: int
    collection_name: str
    ordinal: int
    page: int | None
    char_start: int
    char_end: int
    heading_path: list[str] = field(default_factory=list)


class Retriever:
    """Owns one process's vector index, BM25 index and reranker."""

    def __init__(
        self, embedder: Embedder, index_path: Path, reranker: Reranker, num_candidates: int
    ) -> None:
        self.embedder = embedder
        self.vectors = VectorIndex(index_path, embedder.dimension)
        self.lexical = LexicalIndex()
        self.reranker = reranker
        self.num_candidates = num_candidates
        self._lexical_lock = threading.Lock()

    def _lexical_stamp(self) -> tuple[int, int | None, int | None]:
        stats = Chunk.objects.filter(document__status=Document.Status.READY).aggregate(
            low=Min("id"), high=Max("id")
        )
        count = Chunk.objects.filter(document__status=Document.Status.READY).count()
        return (count, stats["low"], stats["high"])

    def refresh_lexical(self) -> None:
        stamp = self._lexical_stamp()
        if stamp == self.lexical.stamp:
            return
        with self._lexical_lock:
            if stamp == self.lexical.stamp:
                return
            started = time.perf_counter()
            rows = list(
                Chunk.objects.filter(document__status=Document.Status.READY)
                .order_by("id")
                .values_list("id", "text")
            )
            self.lexical.build([r[0] for r in rows], [r[1] for r in rows], stamp)
            logger.info(
                "BM25 index rebuilt over %d chunks in %.2fs",
                len(rows),
                time.perf_counter() - started,
            )

    def candidates(self, query: str, mode: str, allowed_ids: np.ndarray | None) -> list[Candidate]:
        """Fused candidates (before reranking), each with its lexical and dense scores."""
        if mode not in MODES:
            raise ValueError(f"unknown search mode {mode!r}; expected one of {', '.join(MODES)}")
        limit = self.num_candidates
        lexical: list[tuple[int, float]] = []
        dense: list[tuple[int, float]] = []
        if mode != "dense":
            self.refresh_lexical()
            lexical = self.lexical.search(query, limit, allowed_ids)
        if mode != "bm25":
            vector = self.embedder.encode([query])[0]
            dense = self.vectors.search(vector, limit, allowed_ids)
        if mode == "bm25":
            order = lexical
        elif mode == "dense":
            order = dense
        else:
            order = reciprocal_rank_fusion([lexical, dense])
        lexical_scores, dense_scores = dict(lexical), dict(dense)
        return [
            Candidate(cid, "", score, lexical_scores.get(cid), dense_scores.get(cid))
            for cid, score in order
        ]

    def search(
        self,
        query: str,
        *,
        collection_ids: Iterable[int] | None = None,
        top_k: int,
        mode: str = "hybrid+rerank",
    ) -> list[SearchHit]:
        query = query.strip()
        if not query:
            return []
        allowed = None
        if collection_ids is not None:
            allowed = np.fromiter(
                Chunk.objects.filter(
                    document__collection_id__in=list(collection_ids),
                    document__status=Document.Status.READY,
                ).values_list("id", flat=True),
                dtype=np.int64,
            )
        candidates = self.candidates(query, mode, allowed)
        rows = _chunk_rows([c.chunk_id for c in candidates])
        # NOTE: a vector whose chunk is gone (a crash between the database and the index) is
        # dropped here; start-up repair removes it for good.
        candidates = [c for c in candidates if c.chunk_id in rows]
        if mode == "hybrid+rerank":
            for candidate in candidates:
                candidate.text = rows[candidate.chunk_id].text
            candidates = self.reranker.rerank(query, candidates)
        return [_hit(rows[c.chunk_id], c.score) for c in candidates[:top_k]]


def _chunk_rows(chunk_ids: list[int]) -> dict[int, Chunk]:
    queryset = Chunk.objects.filter(
        id__in=chunk_ids, document__status=Document.Status.READY
    ).select_related("document__collection")
    return {chunk.id: chunk for chunk in queryset}


def _hit(chunk: Chunk, score: float) -> SearchHit:
    document = chunk.document
    return SearchHit(
        chunk_id=chunk.id,
        score=score,
        text=chunk.text,
        document_id=document.id,
        document_title=document.title,
        collection_id=document.collection_id,
        collection_name=document.collection.name,
        ordinal=chunk.ordinal,
        page=chunk.page,
        char_start=chunk.char_start,
        char_end=chunk.char_end,
        heading_path=list(chunk.heading_path),
    )


_retriever: Retriever | None = None
_retriever_lock = threading.Lock()


def index_path() -> Path:
    return Path(settings.DATA_DIR) / "index" / "chunks.faiss"


def get_retriever() -> Retriever:
    """The process's retriever; built on first use, when the index is also checked and repaired."""
    global _retriever
    with _retriever_lock:
        if _retriever is None:
            from retrieval.consistency import repair_index

            retriever = Retriever(
                get_embedder(),
                index_path(),
                make_reranker(settings.CACHET_RERANKER),
                settings.CACHET_SEARCH_CANDIDATES,
            )
            repair_index(retriever)
            _retriever = retriever
        return _retriever


def search(
    query: str,
    collections: Iterable[Collection | int] | None = None,
    top_k: int | None = None,
    user: AbstractUser | AnonymousUser | None = None,
    *,
    mode: str = "hybrid+rerank",
) -> list[SearchHit]:
    """Top-K chunks for `query` from `collections` (None: all) that `user` may read.

    `user=None` is a trusted caller (CLI, evaluation); an anonymous or inactive user reads nothing.
    """
    if top_k is None:
        top_k = settings.CACHET_SEARCH_TOP_K
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1; got {top_k}")
    readable = Collection.readable_by(user)
    if collections is not None:
        wanted = [c.pk if isinstance(c, Collection) else int(c) for c in collections]
        readable = readable.filter(pk__in=wanted)
    collection_ids = None
    if user is not None or collections is not None:
        collection_ids = list(readable.values_list("pk", flat=True))
        if not collection_ids:
            return []
    return get_retriever().search(query, collection_ids=collection_ids, top_k=top_k, mode=mode)
