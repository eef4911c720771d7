"""BM25 at scale: PostgreSQL's inverted index against in-process bm25s, on one corpus.

Creates a throwaway PostgreSQL database (`cachet_lexical_bench_<pid>`, dropped at the end) on
the server of `--database-url`, stores `--chunks` chunks through ingestion's own `store()` (one
transaction per document of `--chunks-per-document` chunks: chunks, postings and statistics),
then times `--queries` searches of each store for the retriever's 50 candidates, filtered to
one collection as a chat turn's are: all chunks, or a collection of a tenth of them. Also times
what a change costs each store: storing one more document (PostgreSQL) against the full
rebuild bm25s does at the next search. `--bulk-load` writes the same chunks, postings and
statistics by binary COPY (`bench.lexical_bulk_load`): minutes, not hours, at a million chunks;
with `--keep-database` the corpus stays, and `--existing-database` times searches on it again
without loading it. Chunk texts are real sentences (the Debian Reference
sets in eval/, English and Chinese, and ../shared/eval/squad-dev where present) drawn at random
four to a chunk, so term frequencies are those of real text at any size; queries are the sets'
questions. Prints JSON.

    python -m bench.lexical_store --chunks 20000
    python -m bench.lexical_store --chunks 1000000 --bulk-load --bm25s-limit 0  # the target
    python -m bench.lexical_store --smoke                          # tiny: checks the harness
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse, urlunparse

import numpy as np

from bench.retrieval import percentiles
from harness import cpu_name

if TYPE_CHECKING:
    from retrieval.chunking import ChunkDraft
    from retrieval.models import Collection

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
CORPORA = (
    ROOT / "eval" / "debian-reference-cross",
    ROOT / "eval" / "debian-reference-zh",
    ROOT.parent / "shared" / "eval" / "squad-dev",
)
QUERY_SETS = (
    ROOT / "eval" / "debian-reference-cross-en",
    ROOT / "eval" / "debian-reference-zh",
    ROOT.parent / "shared" / "eval" / "squad-dev",
)
SENTENCE_END = re.compile(r"(?<=[.!?\u3002\uff01\uff1f])\s*")  # Chinese full stops too
SENTENCES_PER_CHUNK = 4
CANDIDATES = 50  # what the retriever asks each store for (CACHET_SEARCH_CANDIDATES)
# Chunks a bulk-load transaction writes: about a million postings, a few hundred MB of Python
# tuples on their way to COPY.
BULK_BATCH_CHUNKS = 20_000


def load_sentences_and_queries(num_queries: int) -> tuple[list[str], list[str]]:
    sentences: list[str] = []
    for corpus in CORPORA:
        if (corpus / "corpus.jsonl").is_file():
            for line in (corpus / "corpus.jsonl").open():
                text = json.loads(line)["text"]
                sentences += [s for s in SENTENCE_END.split(text) if len(s) > 10]
    queries: list[str] = []
    for query_set in QUERY_SETS:
        if (query_set / "queries.jsonl").is_file():
            queries += [json.loads(line)["text"] for line in (query_set / "queries.jsonl").open()]
    random.Random(0).shuffle(queries)
    return sentences, queries[:num_queries]


def load_through_store(
    num_chunks: int,
    per_document: int,
    drafts: Callable[[int], list[ChunkDraft]],
    everything: Collection,
    tenth: Collection,
) -> int:
    """Store the corpus a document at a time through ingestion's store(); the documents."""
    from retrieval.ingest import Prepared, store
    from retrieval.models import Document

    num_documents = 0
    for start in range(0, num_chunks, per_document):
        collection = tenth if num_documents % 10 == 0 else everything
        document = Document.objects.create(collection=collection, title=f"bench-{start}")
        store(Prepared(document, drafts(min(per_document, num_chunks - start))))
        num_documents += 1
        if num_documents % 1000 == 0:
            logger.warning("stored %d chunks", start + per_document)
    return num_documents


def load_in_bulk(
    num_chunks: int,
    per_document: int,
    drafts: Callable[[int], list[ChunkDraft]],
    everything: Collection,
    tenth: Collection,
) -> int:
    """The same documents and chunks as `load_through_store`, by `BulkLoader`; the documents."""
    from bench.lexical_bulk_load import BulkLoader
    from retrieval.ingest import Prepared
    from retrieval.models import Document

    loader = BulkLoader()
    loader.start()
    num_documents = 0
    batch: list[Prepared] = []
    for start in range(0, num_chunks, per_document):
        collection = tenth if num_documents % 10 == 0 else everything
        document = Document(collection=collection, title=f"bench-{start}")
        batch.append(Prepared(document, drafts(min(per_document, num_chunks - start))))
        num_documents += 1
        if len(batch) * per_document >= BULK_BATCH_CHUNKS or start + per_document >= num_chunks:
            Document.objects.bulk_create([prepared.document for prepared in batch])
            loader.add(batch)
            batch = []
            logger.warning("bulk-loaded %d chunks", loader.num_chunks)
    loader.finish()
    return num_documents


def run_bench(
    *,
    num_chunks: int,
    per_document: int,
    num_queries: int,
    bm25s_limit: int,
    bulk_load: bool = False,
    existing: bool = False,
    query_paths: tuple[str, ...] = ("pruned",),
) -> dict[str, object]:
    """Store the corpus in the configured (PostgreSQL) database and time both stores.

    `existing`: the database holds a corpus an earlier run loaded (`--keep-database`): only
    the searches are timed. `query_paths`: PostgreSQL's searches to time, each query through
    each in turn (`exhaustive`: every posting of the terms; `pruned`: the served one); the last
    one is compared with bm25s.
    """
    from django.db import connection

    from retrieval.chunking import ChunkDraft
    from retrieval.ingest import Prepared, store
    from retrieval.lexical_postgres import PostgresLexicalStore
    from retrieval.lexical_store import InProcessLexicalStore
    from retrieval.models import Chunk, Collection, Document

    sentences, queries = load_sentences_and_queries(num_queries)
    rng = random.Random(1)

    def drafts(count: int) -> list[ChunkDraft]:
        texts = [" ".join(rng.sample(sentences, SENTENCES_PER_CHUNK)) for _ in range(count)]
        return [ChunkDraft(text, len(text.split()), 0, len(text)) for text in texts]

    result: dict[str, object] = {}
    if existing:
        everything = Collection.objects.get(name="bench-all")
        tenth = Collection.objects.get(name="bench-tenth")
        num_documents = Document.objects.count()
    else:
        everything = Collection.objects.create(name="bench-all")
        tenth = Collection.objects.create(name="bench-tenth")
        started = time.perf_counter()
        load = load_in_bulk if bulk_load else load_through_store
        num_documents = load(num_chunks, per_document, drafts, everything, tenth)
        result["load"] = "bulk (binary COPY)" if bulk_load else "store(), a document at a time"
        result["store_chunks_per_s"] = round(num_chunks / (time.perf_counter() - started), 1)
        with connection.cursor() as cursor:
            # NOTE: what autovacuum does after a load: statistics, and the visibility map that
            # lets the postings be read from their index alone.
            cursor.execute("VACUUM ANALYZE")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size('retrieval_posting')")
        posting_bytes = cursor.fetchone()[0]

    stores = {path: PostgresLexicalStore(pruned=path == "pruned") for path in query_paths}
    database = stores[query_paths[-1]]
    scopes = {"all collections": None, "one collection of a tenth": [tenth.pk]}
    num_stored = Chunk.objects.count()
    result |= {
        "chunks": num_stored,
        "documents": num_documents,
        "queries": len(queries),
        "candidates": CANDIDATES,
        "posting_table_mb": round(posting_bytes / 2**20, 1),
    }
    for store_ in stores.values():  # warms the connection and the plan cache
        store_.search(queries[0], CANDIDATES)
    timings: dict[str, dict[str, object]] = {path: {} for path in stores}
    differing, score_gaps = 0, [0.0]
    for label, collection_ids in scopes.items():
        latencies: dict[str, list[float]] = {path: [] for path in stores}
        for query in queries:
            # Each query through each path in turn: the same cache state for both.
            answers = []
            for path, store_ in stores.items():
                began = time.perf_counter()
                answers.append(store_.search(query, CANDIDATES, collection_ids=collection_ids))
                latencies[path].append((time.perf_counter() - began) * 1000)
            first = answers[0]
            for other in answers[1:]:
                differing += [i for i, _ in other] != [i for i, _ in first]
                score_gaps += [abs(a[1] - b[1]) / b[1] for a, b in zip(other, first, strict=False)]
        for path in stores:
            timings[path][label] = percentiles(latencies[path])
    postgres = timings[query_paths[-1]]
    for path in query_paths[:-1]:
        result[f"postgresql_{path}_ms"] = timings[path]
    if len(stores) > 1:
        # The paths must answer alike: the same chunks in the same order, the same scores but
        # for float rounding (they add the same terms in another order).
        result["query_paths_differing_answers"] = differing
        result["query_paths_max_relative_score_difference"] = float(f"{max(score_gaps):.2g}")
    if not existing:  # an existing corpus stays as it was loaded, for the next run
        document = Document.objects.create(collection=everything, title="bench-change")
        began = time.perf_counter()
        store(Prepared(document, drafts(per_document)))
        postgres["store_one_document_ms"] = round((time.perf_counter() - began) * 1000, 1)
    result["postgresql_ms"] = postgres
    result["postgresql_query_path"] = query_paths[-1]

    if num_stored > bm25s_limit:
        result["bm25s_ms"] = f"skipped above --bm25s-limit {bm25s_limit} chunks"
        return result
    in_process = InProcessLexicalStore()
    began = time.perf_counter()
    in_process.refresh()
    bm25s: dict[str, object] = {"rebuild_ms": round((time.perf_counter() - began) * 1000, 1)}
    tenth_ids = np.fromiter(
        Chunk.objects.filter(document__collection=tenth).values_list("id", flat=True), np.int64
    )
    agreement, score_gaps = [], []
    for label, allowed in (("all collections", None), ("one collection of a tenth", tenth_ids)):
        latencies = []
        for query in queries:
            began = time.perf_counter()
            hits = in_process.search(query, CANDIDATES, allowed_ids=allowed)
            latencies.append((time.perf_counter() - began) * 1000)
            if allowed is None:
                found = database.search(query, 10)
                expected = hits[:10]
                common = {i for i, _ in found} & {i for i, _ in expected}
                agreement.append(len(common) / max(len(expected), 1))
                # Rank by rank: equal scores where the chunk ids differ are ties at the cut.
                score_gaps += [
                    abs(a[1] - b[1]) / b[1] for a, b in zip(found, expected, strict=False)
                ]
        bm25s[label] = percentiles(latencies)
    result["bm25s_ms"] = bm25s
    result["top10_overlap_postgresql_vs_bm25s"] = round(float(np.mean(agreement)), 4)
    result["top10_max_relative_score_difference"] = float(f"{max(score_gaps, default=0):.2g}")
    return result


def admin_url(url: str, database: str) -> str:
    return urlunparse(urlparse(url)._replace(path=f"/{database}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lexical_store", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--chunks-per-document", type=int, default=10)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL server to create the throwaway database on (its database is ignored)",
    )
    parser.add_argument(
        "--bm25s-limit",
        type=int,
        default=200_000,
        help="above this many chunks bm25s is not built (its memory and rebuild time)",
    )
    parser.add_argument(
        "--keep-database",
        action="store_true",
        help="leave the throwaway database in place (to EXPLAIN queries on it); the log names it",
    )
    parser.add_argument(
        "--bulk-load",
        action="store_true",
        help="write chunks and postings by binary COPY (bench.lexical_bulk_load), not store()",
    )
    parser.add_argument(
        "--existing-database",
        metavar="NAME",
        help="time searches on a corpus an earlier --keep-database run left (not dropped)",
    )
    parser.add_argument(
        "--query-paths",
        default="exhaustive,pruned",
        help="PostgreSQL searches to time, comma-separated: exhaustive, pruned (served)",
    )
    parser.add_argument("--smoke", action="store_true", help="300 chunks, 10 queries")
    args = parser.parse_args(argv)
    if args.smoke:
        args.chunks, args.queries = 300, 10
    query_paths = tuple(args.query_paths.split(","))
    if not query_paths or set(query_paths) - {"exhaustive", "pruned"}:
        parser.error("--query-paths: exhaustive, pruned or both, comma-separated")
    if min(args.chunks, args.chunks_per_document, args.queries) < 1:
        parser.error("--chunks, --chunks-per-document and --queries must be positive")
    if not urlparse(args.database_url).scheme.startswith("postgres"):
        parser.error("--database-url must be a PostgreSQL URL (postgres://user@host:port/db)")

    name = args.existing_database or f"cachet_lexical_bench_{os.getpid()}"
    import psycopg

    server = admin_url(args.database_url, "postgres")
    if not args.existing_database:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
    try:
        os.environ["DATABASE_URL"] = admin_url(args.database_url, name)
        os.environ.setdefault("CACHET_SECRET_KEY", "lexical-bench-throwaway-" + "x" * 32)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", verbosity=0)
        logging.getLogger().setLevel(logging.WARNING)
        result = run_bench(
            num_chunks=args.chunks,
            per_document=args.chunks_per_document,
            num_queries=args.queries,
            bm25s_limit=args.bm25s_limit,
            bulk_load=args.bulk_load,
            existing=bool(args.existing_database),
            query_paths=query_paths,
        )
        result["cpu"] = cpu_name()
        result["load_avg_1m"] = round(os.getloadavg()[0], 2)
        connections.close_all()
    finally:
        if args.keep_database or args.existing_database:
            logger.warning("kept the database %s", name)
        else:
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
