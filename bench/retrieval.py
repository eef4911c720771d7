"""Query latency at scale: embed + BM25 + dense search + fusion + rerank to top-5.

Builds a throwaway index of `--chunks` chunks (default 10,000) in a temporary data dir with its
own SQLite database, from `--unique` passages of a BEIR corpus (default: ../shared/eval/squad-dev,
else synthetic text). Each passage is embedded once; its replicas get perturbed text (words
dropped) and a slightly perturbed, re-normalised vector, so the index holds `--chunks` distinct
vectors without embedding them all (the search cost depends on the count, not on the content).
Then times `--queries` permission-filtered searches as a chat turn makes them. Prints JSON.

    python -m bench.retrieval --json            # 10,000 chunks, 200 queries
    python -m bench.retrieval --json --smoke    # tiny sizes: checks the harness end to end
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "eval" / "squad-dev"
SYNTHETIC_TEXT = """
team report quarter customer product release server network policy document meeting plan budget
support access review change process system service data security request update project design
test deploy issue owner manager office travel expense contract invoice holiday training laptop
"""
SYNTHETIC_WORDS = tuple(SYNTHETIC_TEXT.split())
DOCUMENT_CHUNKS = 50  # chunks per synthetic document row


def load_texts(corpus: Path | None, unique: int, num_queries: int) -> tuple[list[str], list[str]]:
    """Passages and queries: from a BEIR directory if it exists, else synthetic."""
    rng = random.Random(0)
    if corpus is not None and (corpus / "corpus.jsonl").is_file():
        with (corpus / "corpus.jsonl").open() as handle:
            rows = [json.loads(line) for line, _ in zip(handle, range(unique), strict=False)]
        passages = [f"{row.get('title', '')}\n\n{row['text']}" for row in rows]
        with (corpus / "queries.jsonl").open() as handle:
            queries = [json.loads(line)["text"] for line in handle if line.strip()]
        return passages, queries[:num_queries]

    def sentence(words: int) -> str:
        return " ".join(rng.choice(SYNTHETIC_WORDS) for _ in range(words)).capitalize() + "."

    passages = [" ".join(sentence(15) for _ in range(8)) for _ in range(unique)]
    return passages, [sentence(8).rstrip(".") + "?" for _ in range(num_queries)]


def perturb(text: str, replica: int, rng: random.Random) -> str:
    if replica == 0:
        return text
    words = text.split()
    return " ".join(w for w in words if rng.random() > 0.15) + f" (copy {replica})"


def percentiles(samples: list[float]) -> dict[str, float]:
    return {
        "p50": round(float(np.percentile(samples, 50)), 1),
        "p95": round(float(np.percentile(samples, 95)), 1),
        "mean": round(float(np.mean(samples)), 1),
    }


def run_bench(
    data_dir: Path, *, num_chunks: int, unique: int, num_queries: int, corpus: Path | None
) -> dict:
    """Build the index under `data_dir` in the configured database and time the searches."""
    from django.conf import settings

    from retrieval.embeddings import get_embedder
    from retrieval.models import Chunk, Collection, Document
    from retrieval.rerank import make_reranker
    from retrieval.search import Retriever

    passages, queries = load_texts(corpus, unique, num_queries)
    embedder = get_embedder()
    started = time.perf_counter()
    base = np.concatenate(
        [embedder.encode(passages[i : i + 64]) for i in range(0, len(passages), 64)]
    )
    embed_per_s = len(passages) / (time.perf_counter() - started)

    rng = random.Random(1)
    noise = np.random.default_rng(1)
    texts, vectors = [], []
    for position in range(num_chunks):
        replica, source = divmod(position, len(passages))
        texts.append(perturb(passages[source], replica, rng))
        vector = base[source]
        if replica:
            vector = vector + noise.normal(0, 0.02, vector.shape).astype(np.float32)
            vector /= np.linalg.norm(vector)
        vectors.append(vector)

    collection = Collection.objects.create(name=f"bench-{os.getpid()}-{time.time_ns()}")
    documents = Document.objects.bulk_create(
        Document(collection=collection, title=f"bench-{i}", status=Document.Status.READY)
        for i in range(0, num_chunks, DOCUMENT_CHUNKS)
    )
    chunks = Chunk.objects.bulk_create(
        (
            Chunk(
                document=documents[i // DOCUMENT_CHUNKS],
                ordinal=i % DOCUMENT_CHUNKS,
                text=text,
                token_count=len(text.split()),
                char_start=0,
                char_end=len(text),
            )
            for i, text in enumerate(texts)
        ),
        batch_size=500,
    )
    retriever = Retriever(
        embedder,
        Path(data_dir) / "bench.faiss",
        make_reranker(settings.CACHET_RERANKER),
        settings.CACHET_SEARCH_CANDIDATES,
    )
    retriever.vectors.replace([], [c.pk for c in chunks], np.stack(vectors))

    def timed(query: str) -> float:
        began = time.perf_counter()
        retriever.search(query, collection_ids=[collection.pk], top_k=5, mode="hybrid+rerank")
        return (time.perf_counter() - began) * 1000

    started = time.perf_counter()
    timed(queries[0])  # builds the BM25 index, as the first search after a change does
    bm25_build_ms = (time.perf_counter() - started) * 1000
    totals, embeds = [], []
    for query in queries:
        began = time.perf_counter()
        embedder.encode([query], kind="query")
        embeds.append((time.perf_counter() - began) * 1000)
        totals.append(timed(query))
    return {
        "chunks": len(retriever.vectors),
        "unique_passages": len(passages),
        "queries": len(queries),
        "reranker": retriever.reranker.name,
        "candidates": settings.CACHET_SEARCH_CANDIDATES,
        "top_k": 5,
        "latency_ms": percentiles(totals),
        "query_embed_ms": percentiles(embeds),
        "bm25_build_ms": round(bm25_build_ms, 1),
        "embed_passages_per_s": round(embed_per_s, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retrieval", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--unique", type=int, default=1_000, help="passages actually embedded")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--smoke", action="store_true", help="200 chunks, 20 passages, 5 queries")
    args = parser.parse_args(argv)
    if args.smoke:
        args.chunks, args.unique, args.queries = 200, 20, 5
    if min(args.chunks, args.unique, args.queries) < 1 or args.unique > args.chunks:
        parser.error("--chunks, --unique and --queries must be positive, --unique <= --chunks")

    with tempfile.TemporaryDirectory(prefix="cachet-retrieval-bench-") as scratch:
        # NOTE: a private data dir and SQLite file, so the bench never touches real data.
        os.environ["CACHET_DATA_DIR"] = scratch
        os.environ["DATABASE_URL"] = f"sqlite:///{scratch}/bench.sqlite3"
        os.environ.setdefault("CACHET_SECRET_KEY", "retrieval-bench-throwaway-" + "x" * 32)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import django
        import torch

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        logging.getLogger().setLevel(logging.WARNING)
        result = run_bench(
            Path(scratch),
            num_chunks=args.chunks,
            unique=args.unique,
            num_queries=args.queries,
            corpus=args.corpus,
        )
        result["torch_threads"] = torch.get_num_threads()
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
