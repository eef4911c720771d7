"""Why a query retrieved what it did: the whole candidate pool of `search()` and where top-K cut it.

Staff read it on the retrieval test page and in the admin's search preview; both call `explain()`,
which runs the very pipeline chat turns use (`retrieval.search.search_pool`), not a copy of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.utils.translation import gettext as _

from retrieval.models import Collection
from retrieval.search import PoolEntry, get_retriever, search_pool


@dataclass(slots=True)
class Explanation:
    query: str
    mode: str
    top_k: int
    # The most candidates each list (BM25, dense) contributes to the pool.
    num_candidates: int
    reranker: str
    # False while the index is re-embedded: the pool then holds BM25 candidates only.
    dense_ready: bool
    pool: list[PoolEntry]

    @property
    def kept(self) -> list[PoolEntry]:
        return self.pool[: self.top_k]

    @property
    def dropped(self) -> list[PoolEntry]:
        return self.pool[self.top_k :]

    @property
    def last_kept(self) -> PoolEntry | None:
        return self.kept[-1] if self.kept else None

    @property
    def first_dropped(self) -> PoolEntry | None:
        return self.dropped[0] if self.dropped else None

    @property
    def cutoff_reason(self) -> str:
        """Where the top-K cut-off fell, and why, in a sentence."""
        if not self.pool:
            return _(
                "No candidates: no passage of the chosen collections shares a word with the "
                "query, and the dense search found none."
            )
        kept, dropped = self.last_kept, self.first_dropped
        if kept is None or dropped is None:
            return _(
                "All %(count)s candidates were kept: the pool is no larger than top-K (%(top_k)s)."
            ) % {"count": len(self.pool), "top_k": self.top_k}
        return _(
            "Top-K is %(top_k)s: rank %(top_k)s was kept with a score of %(kept).4f and rank "
            "%(next)s dropped with %(dropped).4f; %(num_dropped)s of %(count)s candidates were "
            "dropped."
        ) % {
            "top_k": self.top_k,
            "kept": kept.hit.score,
            "next": self.top_k + 1,
            "dropped": dropped.hit.score,
            "num_dropped": len(self.dropped),
            "count": len(self.pool),
        }


def explain(
    query: str,
    collections: Iterable[Collection | int] | None = None,
    top_k: int | None = None,
    user: AbstractUser | AnonymousUser | None = None,
    *,
    mode: str = "hybrid+rerank",
) -> Explanation:
    """The pool `search()` would rank for these arguments, and its top-K; same permissions."""
    if top_k is None:
        top_k = settings.CACHET_SEARCH_TOP_K
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1; got {top_k}")
    pool = search_pool(query, collections, user, mode=mode)
    retriever = get_retriever()
    return Explanation(
        query=query.strip(),
        mode=mode,
        top_k=top_k,
        num_candidates=retriever.num_candidates,
        reranker=retriever.reranker.name if mode == "hybrid+rerank" else "",
        dense_ready=retriever.dense_ready,
        pool=pool,
    )
