"""`search()`: dense (faiss) and BM25 candidates, fused, reranked to top-K, permission-filtered."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from django.conf import settings
from django.contrib.auth.models import AbstractUser, AnonymousUser

from retrieval.embedders import TextEmbedder
from retrieval.embeddings import get_embedder
from retrieval.fusion import reciprocal_rank_fusion
from retrieval.index import VectorIndex
from retrieval.lexical_store import LexicalStore, make_lexical_store
from retrieval.models import Chunk, Collection, Document
from retrieval.rerank import Candidate, Reranker, make_reranker
from retrieval.vector_store import VectorStore
from retrieval.vector_store_choice import choose_vector_store, make_vector_store

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


@dataclass(slots=True)
class PoolEntry:
    """One candidate of a query's pool, in final order, with why it ranks where it does.

    Ranks count from 1. `fused_*` is the order before reranking (the RRF score in the hybrid
    modes, the BM25 or cosine score in the single ones); `hit.score` is the final score.
    """

    hit: SearchHit
    final_rank: int
    fused_rank: int
    fused_score: float
    lexical_rank: int | None
    lexical_score: float | None
    dense_rank: int | None
    dense_score: float | None


class Retriever:
    """Owns one process's vector index, BM25 index and reranker."""

    def __init__(
        self,
        embedder: TextEmbedder,
        index_path: Path,
        reranker: Reranker,
        num_candidates: int,
        lexical: LexicalStore | None = None,
    ) -> None:
        self.embedder = embedder
        self.vectors: VectorStore = VectorIndex(index_path, embedder.dimension, embedder.model_id)
        # False while the whole index is re-embedded (retrieval.consistency): until then a
        # search ranks by BM25 alone rather than fuse with a partial dense ranking or wait.
        self.dense_ready = True
        # BM25: in-process bm25s or PostgreSQL's inverted index (retrieval.lexical_store).
        self.lexical = lexical or make_lexical_store()
        self.reranker = reranker
        self.num_candidates = num_candidates

    def candidates(
        self,
        query: str,
        mode: str,
        allowed_ids: np.ndarray | None,
        collection_ids: list[int] | None = None,
    ) -> list[Candidate]:
        """Fused candidates (before reranking), each with its lexical and dense scores."""
        if mode not in MODES:
            raise ValueError(f"unknown search mode {mode!r}; expected one of {', '.join(MODES)}")
        limit = self.num_candidates
        lexical: list[tuple[int, float]] = []
        dense: list[tuple[int, float]] = []
        if mode != "dense":
            lexical = self.lexical.search(
                query, limit, allowed_ids=allowed_ids, collection_ids=collection_ids
            )
        if mode != "bm25" and self.dense_ready:
            vector = self.embedder.encode([query], kind="query")[0]
            dense = self.vectors.search(vector, limit, allowed_ids, collection_ids)
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
        pool = self.ranked_pool(query, collection_ids=collection_ids, mode=mode)
        return [entry.hit for entry in pool[:top_k]]

    def ranked_pool(
        self,
        query: str,
        *,
        collection_ids: Iterable[int] | None = None,
        mode: str = "hybrid+rerank",
    ) -> list[PoolEntry]:
        """Every candidate in final order (top-K is its head), with scores and ranks."""
        query = query.strip()
        if not query:
            return []
        allowed = None
        scope = None if collection_ids is None else list(collection_ids)
        if scope is not None:
            allowed = np.fromiter(
                Chunk.objects.filter(
                    document__collection_id__in=scope,
                    document__status=Document.Status.READY,
                ).values_list("id", flat=True),
                dtype=np.int64,
            )
        candidates = self.candidates(query, mode, allowed, scope)
        rows = _chunk_rows([c.chunk_id for c in candidates])
        # NOTE: a vector whose chunk is gone (a crash between the database and the index) is
        # dropped here; start-up repair removes it for good.
        fused = [c for c in candidates if c.chunk_id in rows]
        final = fused
        if mode == "hybrid+rerank":
            for candidate in fused:
                candidate.text = rows[candidate.chunk_id].text
            final = self.reranker.rerank(query, fused)
        fused_ranks = {c.chunk_id: (rank, c.score) for rank, c in enumerate(fused, start=1)}
        lexical_ranks = _ranks(fused, lambda c: c.lexical_score)
        dense_ranks = _ranks(fused, lambda c: c.dense_score)
        return [
            PoolEntry(
                hit=_hit(rows[c.chunk_id], c.score),
                final_rank=rank,
                fused_rank=fused_ranks[c.chunk_id][0],
                fused_score=fused_ranks[c.chunk_id][1],
                lexical_rank=lexical_ranks.get(c.chunk_id),
                lexical_score=c.lexical_score,
                dense_rank=dense_ranks.get(c.chunk_id),
                dense_score=c.dense_score,
            )
            for rank, c in enumerate(final, start=1)
        ]


def _ranks(
    candidates: list[Candidate], score_of: Callable[[Candidate], float | None]
) -> dict[int, int]:
    """Chunk id -> rank (from 1) by one list's score, for the candidates that list found."""
    scored: list[tuple[int, float]] = []
    for candidate in candidates:
        score = score_of(candidate)
        if score is not None:
            scored.append((candidate.chunk_id, score))
    scored.sort(key=lambda pair: pair[1], reverse=True)  # stable: ties keep the fused order
    return {chunk_id: rank for rank, (chunk_id, _) in enumerate(scored, start=1)}


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
    """The process's retriever; built on first use, when the index is also checked and repaired.

    An index that must be re-embedded whole (corrupt, or another embedding model's) is rebuilt
    by the thread that built the retriever, after publishing it: other threads search meanwhile,
    by BM25 alone (`Retriever.dense_ready`), instead of waiting minutes for the embeddings.
    """
    global _retriever
    from retrieval.consistency import rebuild_index, set_aside_if_unusable, sync_ids
    from retrieval.faiss_import import import_left_faiss_index

    with _retriever_lock:
        if _retriever is not None:
            return _retriever
        retriever = Retriever(
            get_embedder(),
            index_path(),
            make_reranker(settings.CACHET_RERANKER),
            settings.CACHET_SEARCH_CANDIDATES,
        )
        # The vector store chosen for this database (retrieval.vector_store): faiss or pgvector.
        retriever.vectors = make_vector_store(
            choose_vector_store(settings.CACHET_VECTOR_STORE),
            retriever.embedder.dimension,
            retriever.embedder.model_id,
            index_path(),
        )
        if set_aside_if_unusable(retriever.vectors):
            import_left_faiss_index(index_path(), retriever.vectors)  # a move to pgvector
            sync_ids(retriever)  # NOTE: checked usable just above: not verified twice
            _retriever = retriever
            return retriever
        retriever.dense_ready = False
        _retriever = retriever
    try:
        rebuild_index(retriever)
    finally:
        retriever.dense_ready = True
    return retriever


def current_retriever() -> Retriever | None:
    """The process's retriever if one has been built (never builds one)."""
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
    return [entry.hit for entry in search_pool(query, collections, user, mode=mode)[:top_k]]


def search_pool(
    query: str,
    collections: Iterable[Collection | int] | None = None,
    user: AbstractUser | AnonymousUser | None = None,
    *,
    mode: str = "hybrid+rerank",
) -> list[PoolEntry]:
    """The whole ranked candidate pool behind `search()` (same arguments, same permissions)."""
    readable = Collection.readable_by(user)
    if collections is not None:
        wanted = [c.pk if isinstance(c, Collection) else int(c) for c in collections]
        readable = readable.filter(pk__in=wanted)
    collection_ids = None
    if user is not None or collections is not None:
        collection_ids = list(readable.values_list("pk", flat=True))
        if not collection_ids:
            return []
    return get_retriever().ranked_pool(query, collection_ids=collection_ids, mode=mode)
