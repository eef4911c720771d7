"""Cachet's own retrieval over the squad-dev passages, for the end-to-end answer benchmark.

Each passage becomes a document (titled with its Wikipedia article, as a user's upload is titled)
of a throwaway collection, ingested through the product's pipeline (extract, chunk, embed,
store) into a faiss index of its own in a temporary directory; questions are then searched the
way a chat turn searches (hybrid BM25 + dense, fused, reranked, top-K, with the site's
reranker and candidate settings). The collection and its files are deleted afterwards. Needs
Django set up (a scratch site: see `bench.answer_quality.main`).
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.squad_questions import Passage, SquadQuestion

logger = logging.getLogger(__name__)

SEARCH_MODE = "hybrid+rerank"  # what chat turns use (retrieval.search.search's default)


@dataclass(slots=True)
class Retrieved:
    """Per question (in order): the top-K hits, and the gold passage's number among them."""

    hits: list[list]  # list[list[retrieval.search.SearchHit]]
    gold_numbers: list[int | None]  # the gold passage's "[n]" among the hits; None: not found
    num_passages: int
    num_chunks: int
    index_s: float
    search_s: float
    top_k: int

    @property
    def has_gold(self) -> list[bool]:
        return [number is not None for number in self.gold_numbers]

    @property
    def gold_recall(self) -> float:
        return sum(self.has_gold) / len(self.has_gold) if self.has_gold else 0.0


def passages_to_index(
    questions: Sequence[SquadQuestion], corpus: Sequence[Passage], limit: int | None
) -> list[Passage]:
    """The first `limit` corpus passages (all if None) plus every question's gold passage, so a
    small index still holds each answer among distractors."""
    chosen = {passage.passage_id: passage for passage in corpus[:limit]}
    for question in questions:
        chosen.setdefault(question.passage.passage_id, question.passage)
    return list(chosen.values())


def retrieve(
    questions: Sequence[SquadQuestion], passages: Sequence[Passage], *, top_k: int | None = None
) -> Retrieved:
    """Index `passages` in a throwaway collection, search every question, delete it again."""
    from django.conf import settings

    from retrieval.embeddings import get_embedder
    from retrieval.models import Chunk, Collection, Document
    from retrieval.postings import delete_chunks
    from retrieval.rerank import make_reranker
    from retrieval.search import Retriever

    top_k = top_k or settings.CACHET_SEARCH_TOP_K
    collection = Collection.objects.create(
        name=f"answer-quality-{uuid.uuid4().hex[:12]}", description="throwaway: squad-dev"
    )
    with tempfile.TemporaryDirectory(prefix="cachet-answer-quality-") as scratch:
        retriever = Retriever(
            get_embedder(),
            Path(scratch) / "chunks.faiss",
            make_reranker(settings.CACHET_RERANKER),
            settings.CACHET_SEARCH_CANDIDATES,
        )
        try:
            started = time.perf_counter()
            passage_of_document = _ingest(retriever, collection, passages)
            index_s = time.perf_counter() - started
            started = time.perf_counter()
            hits = [
                retriever.search(
                    question.question, collection_ids=[collection.pk], top_k=top_k, mode=SEARCH_MODE
                )
                for question in questions
            ]
            search_s = time.perf_counter() - started
            num_chunks = len(retriever.vectors)
        finally:
            for document in Document.objects.filter(collection=collection):
                document.file.delete(save=False)
            delete_chunks(Chunk.objects.filter(document__collection=collection))
            collection.delete()
    gold_numbers = [
        next(
            (
                number
                for number, hit in enumerate(found, start=1)
                if passage_of_document[hit.document_id] == question.passage.passage_id
            ),
            None,
        )
        for question, found in zip(questions, hits, strict=True)
    ]
    has_gold = [number is not None for number in gold_numbers]
    logger.info(
        "retrieval: %d passages, %d chunks indexed in %.1fs; gold passage in the top %d for "
        "%d of %d questions", len(passages), num_chunks, index_s, top_k, sum(has_gold),
        len(questions),
    )  # fmt: skip
    return Retrieved(hits, gold_numbers, len(passages), num_chunks, index_s, search_s, top_k)


def _ingest(retriever, collection, passages: Sequence[Passage]) -> dict[int, str]:
    """Ingest every passage as a document; document id -> passage id."""
    from django.core.files.base import ContentFile

    from retrieval.ingest import embed, prepare, store
    from retrieval.models import Document

    documents = [
        Document.objects.create(
            collection=collection,
            title=passage.title or passage.passage_id,
            file=ContentFile(passage.text.encode(), name=f"{passage.passage_id}.txt"),
        )
        for passage in passages
    ]
    prepared = [prepare(document, retriever) for document in documents]
    vectors = embed(retriever, [draft.text for item in prepared for draft in item.drafts])
    chunk_ids: list[int] = []
    for item in prepared:
        chunk_ids.extend(store(item)[1])
    retriever.vectors.replace([], chunk_ids, vectors)
    return {
        document.pk: passage.passage_id
        for document, passage in zip(documents, passages, strict=True)
    }
