"""Retrieval evaluation on a BEIR-layout set (corpus.jsonl, queries.jsonl, qrels/test.tsv).

The corpus is ingested through the real pipeline into a throwaway collection with its own
temporary faiss index; every mode is then scored per query, and everything is deleted again.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from django.core.files.base import ContentFile

from retrieval.embedders import TextEmbedder
from retrieval.embeddings import get_embedder
from retrieval.ingest import embed, prepare, store
from retrieval.lexical_store import make_lexical_store
from retrieval.models import Chunk, Collection, Document
from retrieval.postings import analyze_tables, delete_chunks
from retrieval.rerank import Reranker, make_reranker
from retrieval.search import MODES, Retriever

logger = logging.getLogger(__name__)


def load_beir(
    directory: Path,
) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, set[str]]]:
    directory = Path(directory)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} is not a BEIR-layout set: no {name}")
    corpus = [json.loads(line) for line in (directory / "corpus.jsonl").open() if line.strip()]
    queries = {
        row["_id"]: row["text"]
        for row in map(json.loads, (directory / "queries.jsonl").open())
        if row
    }
    qrels: dict[str, set[str]] = {}
    for number, line in enumerate((directory / "qrels/test.tsv").open()):
        parts = line.rstrip("\n").split("\t")
        if (number == 0 and parts[0] == "query-id") or len(parts) < 3:
            continue
        if float(parts[2]) > 0:
            qrels.setdefault(parts[0], set()).add(parts[1])
    return corpus, queries, qrels


def score_ranking(ranked: list[str], relevant: set[str]) -> dict[str, float]:
    def recall(k: int) -> float:
        return len(relevant.intersection(ranked[:k])) / len(relevant)

    mrr = next((1.0 / rank for rank, d in enumerate(ranked[:10], 1) if d in relevant), 0.0)
    dcg = sum(1.0 / math.log2(rank + 1) for rank, d in enumerate(ranked[:10], 1) if d in relevant)
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(len(relevant), 10) + 1))
    return {
        "recall1": recall(1),
        "recall5": recall(5),
        "recall10": recall(10),
        "mrr10": mrr,
        "ndcg10": dcg / ideal,
    }


def evaluate(
    directory: Path,
    *,
    max_queries: int | None = None,
    reranker: Reranker | None = None,
    modes: tuple[str, ...] = MODES,
    candidates: int = 50,
    embedder: TextEmbedder | None = None,
    lexical_stores: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Scores per mode of the pipeline on a BEIR set; `embedder`: None for the configured one.

    `lexical_stores` (names of `retrieval.lexical_store`): every mode is scored with each of
    them in turn, over the one ingested corpus, under `by_lexical_store`; None: the configured
    store, scores at the top level. Without a mode that needs vectors nothing is embedded.
    """
    corpus, queries, qrels = load_beir(directory)
    query_ids = [q for q in queries if q in qrels][:max_queries]
    embedder = embedder or get_embedder()
    collection = Collection.objects.create(
        name=f"eval-{uuid.uuid4().hex[:12]}", description=f"throwaway: {directory}"
    )
    with tempfile.TemporaryDirectory(prefix="cachet-eval-") as scratch:
        retriever = Retriever(
            embedder,
            Path(scratch) / "chunks.faiss",
            reranker or make_reranker("fusion"),
            candidates,
        )
        try:
            with_vectors = any(mode != "bm25" for mode in modes)
            chunks_per_s = _ingest_corpus(retriever, collection, corpus, with_vectors)
            result: dict[str, Any] = {}
            if lexical_stores is None:
                for mode in modes:
                    result[mode] = _run_mode(retriever, collection, mode, query_ids, queries, qrels)
            else:
                result["by_lexical_store"] = {}
                for name in lexical_stores:
                    retriever.lexical = make_lexical_store(name)
                    result["by_lexical_store"][name] = {
                        mode: _run_mode(retriever, collection, mode, query_ids, queries, qrels)
                        for mode in modes
                    }
            result["ingest_chunks_per_s"] = round(chunks_per_s, 1)
            result["num_queries"] = len(query_ids)
            result["num_chunks"] = Chunk.objects.filter(document__collection=collection).count()
            result["reranker"] = retriever.reranker.name
            result["embedding_model"] = embedder.model_id
            return result
        finally:
            documents = Document.objects.filter(collection=collection)
            for document in documents:
                document.file.delete(save=False)
            delete_chunks(Chunk.objects.filter(document__collection=collection))
            collection.delete()


def _ingest_corpus(
    retriever: Retriever,
    collection: Collection,
    corpus: list[dict[str, Any]],
    with_vectors: bool = True,
) -> float:
    documents = [
        Document.objects.create(
            collection=collection,
            title=row["_id"],
            file=ContentFile(
                (f"{row.get('title', '')}\n\n{row['text']}").encode(), name=f"{row['_id']}.txt"
            ),
        )
        for row in corpus
    ]
    started = time.perf_counter()
    prepared = [prepare(document, retriever) for document in documents]
    texts = [draft.text for p in prepared for draft in p.drafts]
    vectors = embed(retriever, texts) if with_vectors else None
    all_ids: list[int] = []
    for item in prepared:
        all_ids.extend(store(item)[1])
    if vectors is not None:
        retriever.vectors.replace([], all_ids, vectors)
    analyze_tables()  # a bulk load: the planner's statistics, as autovacuum would refresh them
    elapsed = time.perf_counter() - started
    logger.info("ingested %d chunks in %.1fs", len(all_ids), elapsed)
    return len(all_ids) / elapsed


def _run_mode(
    retriever: Retriever,
    collection: Collection,
    mode: str,
    query_ids: list[str],
    queries: dict[str, str],
    qrels: dict[str, set[str]],
) -> dict[str, float]:
    totals: dict[str, float] = {}
    latencies: list[float] = []
    for query_id in query_ids:
        started = time.perf_counter()
        hits = retriever.search(
            queries[query_id], collection_ids=[collection.pk], top_k=30, mode=mode
        )
        latencies.append((time.perf_counter() - started) * 1000)
        ranked: list[str] = []
        for hit in hits:
            if hit.document_title not in ranked:
                ranked.append(hit.document_title)
        for key, value in score_ranking(ranked, qrels[query_id]).items():
            totals[key] = totals.get(key, 0.0) + value
    count = max(len(query_ids), 1)
    metrics = {key: round(value / count, 4) for key, value in totals.items()}
    metrics["p50_ms"] = round(float(np.percentile(latencies, 50)), 1) if latencies else 0.0
    metrics["p95_ms"] = round(float(np.percentile(latencies, 95)), 1) if latencies else 0.0
    return metrics
