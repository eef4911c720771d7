"""Dense search per vector store at scale: recall@10 against exact search, and latency.

Fills a throwaway database with `--chunks` synthetic unit vectors (the embedding model's
dimension, 384; no model runs: a search's cost depends on the count and the dimension, not on
the text) grouped around `--chunks / 100` random centres, as embeddings of related passages are,
in ready documents of `--chunks-per-document` consecutive chunks, dealt in turn to
`--collections` collections. Then times `--queries` searches for
the 10 nearest chunks, each once over everything, once filtered to one collection (1 in
`--collections` of the chunks: a user who may read one knowledge base) and, with 6 collections
or more, once filtered to 3 (`filtered_3`), and scores each against exact search (numpy, over
the same filter). A query is a stored vector plus noise.

- `--store faiss`: a SQLite database and the faiss file in a temporary directory; the filtered
  search first reads the collection's chunk ids from the database, as `Retriever.ranked_pool`
  does (`filter_ids_ms`), then searches the file with them (`search_ms`).
- `--store pgvector`: PostgreSQL with pgvector, one query with the filter in it. `--database-url`
  names a server (a database `cachet_bench_vectors` is created there and dropped afterwards);
  without it the bundled server of the test extra runs (`harness.bundled_postgres`). Chunk rows
  and vectors go in by one binary COPY, before the HNSW index is built (`index_build_s`), as
  `import_faiss_index` into an empty column would not: at scale a bulk build is much faster
  than inserting row by row. Then each collection of more than `--own-index-rows` chunks gets
  its own HNSW index, as `manage.py index_collections` builds them (`collection_index_build_s`).
  `--plans planner,hnsw` times the store as served (a large collection through its own index),
  then with the whole table's HNSW index forced for every search, on the same load.

    python -m bench.vector_store --chunks 20000 --store pgvector --plans planner,hnsw
    python -m bench.vector_store --chunks 1000000 --store pgvector --database-url postgres://...

NOTE: the layout on disk is ingestion's: a document's chunks are written together, in one
transaction, so they sit side by side in the table, and a collection's documents lie between
other collections'. An exact read of one collection costs its pages, not its rows; chunks dealt
to collections one by one (as this bench once did) put every row of a page in another
collection, and the read of 50,000 of a million chunks then touched a quarter of the table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from bench.retrieval import percentiles
from bench.throwaway_database import throwaway_database
from harness import cpu_name

DIMENSION = 384
MODEL = "bench-synthetic"
BENCH_DATABASE = "cachet_bench_vectors"
LOAD_BATCH = 10_000
TOP = 10
# The collections of the "several" filter.
SEVERAL = 3


def synthetic_vectors(count: int, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors around count/100 random centres (spread ~ a centre's own length)."""
    centres = rng.standard_normal((max(1, count // 100), DIMENSION)).astype(np.float32)
    vectors = centres[rng.integers(len(centres), size=count)]
    vectors += rng.standard_normal((count, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def make_rows(
    num_chunks: int, num_collections: int, chunks_per_document: int
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Chunk rows in the database: (chunk ids, each chunk's collection index, collection ids)."""
    from retrieval.models import Chunk

    documents, owner, collection_ids = make_documents(
        num_chunks, num_collections, chunks_per_document
    )
    ids: list[int] = []
    for start in range(0, num_chunks, LOAD_BATCH):
        created = Chunk.objects.bulk_create(
            Chunk(
                document_id=documents[i],
                ordinal=i,
                text="",
                token_count=0,
                char_start=0,
                char_end=0,
            )
            for i in range(start, min(start + LOAD_BATCH, num_chunks))
        )
        ids.extend(chunk.pk for chunk in created)
    return np.asarray(ids, dtype=np.int64), owner, collection_ids


def make_documents(
    num_chunks: int, num_collections: int, chunks_per_document: int
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Ready documents of `chunks_per_document` consecutive chunks, document k in collection
    k mod `num_collections`: (each chunk's document id, each chunk's collection index,
    collection ids)."""
    from retrieval.models import Collection, Document

    collections = [Collection.objects.create(name=f"bench-{i}") for i in range(num_collections)]
    num_documents = -(-num_chunks // chunks_per_document)
    documents = Document.objects.bulk_create(
        Document(
            collection=collections[k % num_collections],
            title=f"bench-{k}",
            status=Document.Status.READY,
        )
        for k in range(num_documents)
    )
    document_of_chunk = np.arange(num_chunks) // chunks_per_document
    document_ids = np.asarray([d.pk for d in documents], dtype=np.int64)[document_of_chunk]
    owner = document_of_chunk % num_collections
    return document_ids, owner, [c.pk for c in collections]


def copy_rows_with_vectors(document_ids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Chunk rows and their vectors in one binary COPY (PostgreSQL); returns the chunk ids.

    NOTE: the store's own writes send vectors as text, an UPDATE per batch (~1,000-1,500 a
    second here): fine for a document, hours for a million. Binary COPY sends each vector as
    pgvector's wire form (dimension, unused, float4s big-endian), parsed by nothing.
    """
    import struct

    from django.db import connection
    from psycopg.adapt import Dumper
    from psycopg.pq import Format
    from psycopg.types import TypeInfo
    from psycopg.types.json import Jsonb

    from retrieval.pgvector_store import COLUMN, INDEX, TABLE

    connection.ensure_connection()
    raw = connection.connection
    info = TypeInfo.fetch(raw, "vector")
    assert info is not None, "the vector extension is not installed"
    info.register(raw)

    class VectorBinaryDumper(Dumper):
        format = Format.BINARY
        oid = info.oid

        def dump(self, obj: Any) -> bytes:
            return struct.pack(">HH", len(obj), 0) + obj.astype(">f4").tobytes()

    raw.adapters.register_dumper(np.ndarray, VectorBinaryDumper)
    columns = "document_id, ordinal, text, token_count, char_start, char_end, heading_path"
    empty_path = Jsonb([])
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")  # built after the load, in bulk
        with cursor.cursor.copy(
            f"COPY {TABLE} ({columns}, {COLUMN}) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["int8", "int4", "text", "int4", "int4", "int4", "jsonb", "vector"])
            for i, vector in enumerate(vectors):
                copy.write_row((int(document_ids[i]), i, "", 0, 0, 0, empty_path, vector))
        # ordinal = the vector's row in `vectors` (unique per document, as the table requires)
        cursor.execute(f"SELECT ordinal, id FROM {TABLE}")
        ids = np.zeros(len(vectors), dtype=np.int64)
        for ordinal, chunk_id in cursor.fetchall():
            ids[ordinal] = chunk_id
    return ids


def build_hnsw_index(m: int = 16, ef_construction: int = 64) -> float:
    """(Re)build the HNSW index over the loaded vectors; returns the build's seconds.

    NOTE: built after the load, as one bulk build: inserting a million vectors into a live
    HNSW graph one by one costs several times more. maintenance_work_mem holds the whole graph
    (~2.5 kB a 384-dimensional vector); short of it, the build goes on on disk, far slower.
    """
    from django.db import connection

    from retrieval.pgvector_store import COLUMN, INDEX, TABLE

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE {COLUMN} IS NOT NULL")
        count = cursor.fetchone()[0]
        megabytes = max(256, int(count * 2.5 / 1024 * 1.5))
        cursor.execute(f"SET maintenance_work_mem = '{megabytes}MB'")
        # NOTE: one worker beside the leader: the bench runs niced on a shared 2-core machine.
        cursor.execute("SET max_parallel_maintenance_workers = 1")
        began = time.perf_counter()
        cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")  # NOTE: bulk-built, never added to
        cursor.execute(
            f"CREATE INDEX {INDEX} ON {TABLE} USING hnsw ({COLUMN} vector_ip_ops) "
            f"WITH (m = {int(m)}, ef_construction = {int(ef_construction)})"
        )
        build_s = time.perf_counter() - began
        cursor.execute(f"ANALYZE {TABLE}")
        cursor.execute("ANALYZE retrieval_document")
    return build_s


def used_indexes(store: Any, query: np.ndarray, collection_ids: list[int] | None) -> list[str]:
    """The HNSW indexes PostgreSQL's plans for this search, as the store runs it, scan: the
    whole table's, a collection's own, or none (an exact read)."""
    from django.db import connection, transaction

    from retrieval.pgvector_store import INDEX

    found = []
    with transaction.atomic(), connection.cursor() as cursor:
        store.configure_search(cursor, TOP)
        for search in store.search_queries(cursor, query, TOP, collection_ids):
            cursor.execute(f"EXPLAIN {search.sql}", search.params)
            for (line,) in cursor.fetchall():
                found += [word for word in line.split() if word.startswith(INDEX)]
    return found


def set_plan(store: Any, plan: str, exact_rows: int) -> None:
    """`planner`: the store as it serves; `hnsw`: the index for every search, filtered or not.

    NOTE: the exact plans sort by distance, the HNSW plan does not: with sorting made
    "expensive" (and the store's exact read of a narrow filter off), the planner takes the
    index even where an exact scan would be cheaper.
    """
    from django.db import connection

    store.exact_rows = 0 if plan == "hnsw" else exact_rows
    store.use_collection_indexes = plan != "hnsw"
    with connection.cursor() as cursor:
        cursor.execute("SET enable_sort = off" if plan == "hnsw" else "RESET enable_sort")


def run_bench(
    store_name: str,
    *,
    num_chunks: int,
    num_collections: int,
    num_queries: int,
    chunks_per_document: int = 100,
    ef_searches: tuple[int, ...] | None = None,
    plans: tuple[str, ...] = ("planner",),
    exact_rows: int | None = None,
    own_index_rows: int | None = None,
    m: int = 16,
    ef_construction: int = 64,
) -> dict[str, Any]:
    """The measurements; `plans` keyed by plan, or by `plan/efN` when several `ef_searches`
    are measured one after the other on the one index."""
    from django.conf import settings

    from retrieval.collection_indexes import OWN_INDEX_ROWS, update_collection_indexes
    from retrieval.models import Chunk
    from retrieval.pgvector_store import EF_SEARCH, EXACT_ROWS, PgVectorStore
    from retrieval.vector_store import VectorStore
    from retrieval.vector_store_choice import choose_vector_store, make_vector_store

    ef_searches = ef_searches or (EF_SEARCH,)
    rng = np.random.default_rng(0)
    choice = choose_vector_store(store_name)  # NOTE: refuses pgvector where it cannot run
    store: VectorStore = make_vector_store(
        choice, DIMENSION, MODEL, Path(settings.DATA_DIR) / "index" / "chunks.faiss"
    )
    if not isinstance(store, PgVectorStore):
        plans, ef_searches = ("exact",), ef_searches[:1]
    vectors = synthetic_vectors(num_chunks, rng)
    began = time.perf_counter()
    index_build_s = collection_index_build_s = None
    own_indexes: list[int] = []
    if isinstance(store, PgVectorStore):
        document_ids, owner, collection_ids = make_documents(
            num_chunks, num_collections, chunks_per_document
        )
        ids = copy_rows_with_vectors(document_ids, vectors)
        load_s = time.perf_counter() - began
        index_build_s = build_hnsw_index(m, ef_construction)
        built_at = time.perf_counter()
        own_pass = update_collection_indexes(
            min_rows=OWN_INDEX_ROWS if own_index_rows is None else own_index_rows
        )
        own_indexes = [] if own_pass is None else own_pass.built
        collection_index_build_s = time.perf_counter() - built_at
    else:
        ids, owner, collection_ids = make_rows(num_chunks, num_collections, chunks_per_document)
        store.replace([], ids.tolist(), vectors)
        load_s = time.perf_counter() - began

    def allowed(collections: list[int]) -> np.ndarray:
        chunks = Chunk.objects.filter(document__collection_id__in=collections)
        return np.fromiter(chunks.values_list("id", flat=True), dtype=np.int64)

    queries = []
    for _ in range(num_queries):
        query = vectors[rng.integers(num_chunks)] + 0.5 * rng.standard_normal(DIMENSION) / np.sqrt(
            DIMENSION
        )
        queries.append((query / np.linalg.norm(query)).astype(np.float32))
    # NOTE: a user who may read one knowledge base, and one who may read several (3 of them,
    # where there are enough: a search per collection with its own index, merged)
    scopes = {"unfiltered": 0, "filtered": 1}
    if num_collections >= 2 * SEVERAL:
        scopes[f"filtered_{SEVERAL}"] = SEVERAL

    def scope_of(kind: str, q: int) -> list[int]:
        return [(q + j) % num_collections for j in range(scopes[kind])]

    exact: dict[tuple[str, int], set[int]] = {}
    for kind in scopes:
        for q, query in enumerate(queries):
            mask = np.isin(owner, scope_of(kind, q)) if scopes[kind] else slice(None)
            best = ids[mask][np.argsort(-(vectors[mask] @ query))[:TOP]]
            exact[kind, q] = set(best.tolist())

    measured: dict[str, Any] = {}
    for plan, ef_search in itertools.product(plans, ef_searches):
        if isinstance(store, PgVectorStore):
            set_plan(store, plan, EXACT_ROWS if exact_rows is None else exact_rows)
            store.ef_search = ef_search
        results: dict[str, Any] = {}
        for kind in scopes:
            timings: dict[str, list[float]] = {"total_ms": [], "filter_ids_ms": [], "search_ms": []}
            recalls = []
            for q, query in enumerate(queries):
                scope = [collection_ids[c] for c in scope_of(kind, q)] if scopes[kind] else None
                began = time.perf_counter()
                allowed_ids = None
                if scope is not None and not store.in_database:
                    allowed_ids = allowed(scope)
                filtered_at = time.perf_counter()
                found = store.search(query, TOP, allowed_ids, scope)
                done = time.perf_counter()
                timings["filter_ids_ms"].append((filtered_at - began) * 1000)
                timings["search_ms"].append((done - filtered_at) * 1000)
                timings["total_ms"].append((done - began) * 1000)
                recalls.append(len({i for i, _ in found} & exact[kind, q]) / TOP)
            results[kind] = {
                "recall_at_10": round(float(np.mean(recalls)), 4),
                "min_recall_at_10": round(float(np.min(recalls)), 2),
                **{name: percentiles(samples) for name, samples in timings.items()},
            }
        # NOTE: PostgreSQL's planner picks an exact scan where it costs less (small tables, a
        # narrow filter); recall is then 1.0 and the HNSW index is not what was timed.
        if isinstance(store, PgVectorStore):
            results["hnsw_indexes_used"] = {
                kind: used_indexes(
                    store,
                    queries[0],
                    [collection_ids[c] for c in scope_of(kind, 0)] if scopes[kind] else None,
                )
                for kind in scopes
            }
        measured[plan if len(ef_searches) == 1 else f"{plan}/ef{ef_search}"] = results
    return {
        "store": store.describe(),
        "chunks": len(store),
        "dimension": DIMENSION,
        "collections": num_collections,
        "chunks_per_document": chunks_per_document,
        "queries": num_queries,
        "ef_search": list(ef_searches) if store_name == "pgvector" else None,
        "hnsw": {"m": m, "ef_construction": ef_construction} if store_name == "pgvector" else None,
        "exact_rows": (EXACT_ROWS if exact_rows is None else exact_rows)
        if store_name == "pgvector"
        else None,
        "load_s": round(load_s, 1),
        "load_vectors_per_s": round(num_chunks / load_s),
        "index_build_s": None if index_build_s is None else round(index_build_s, 1),
        "collections_with_own_index": len(own_indexes),
        "collection_index_build_s": None
        if collection_index_build_s is None
        else round(collection_index_build_s, 1),
        "plans": measured,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpu": cpu_name(),
    }


@contextmanager
def bench_database(store_name: str, scratch: Path, database_url: str | None) -> Iterator[str]:
    """The DATABASE_URL to bench in: SQLite for faiss, a fresh PostgreSQL database for pgvector
    (`bench.throwaway_database`: on the bundled server without `database_url`)."""
    if store_name == "faiss":
        yield f"sqlite:///{scratch}/bench.sqlite3"
        return
    with throwaway_database(BENCH_DATABASE, database_url) as url:
        yield url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vector_store", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--store", choices=("faiss", "pgvector"), required=True)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--collections", type=int, default=20)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--chunks-per-document",
        type=int,
        default=100,
        help="consecutive chunks a document (documents go to the collections in turn)",
    )
    parser.add_argument(
        "--ef-search",
        default="",
        help="pgvector's hnsw.ef_search (default: the store's EF_SEARCH); comma-separated "
        "values are measured one after the other on the one index (plans keyed `plan/efN`)",
    )
    parser.add_argument("--m", type=int, default=16, help="pgvector HNSW build: m")
    parser.add_argument(
        "--ef-construction", type=int, default=64, help="pgvector HNSW build: ef_construction"
    )
    parser.add_argument(
        "--exact-rows",
        type=int,
        default=None,
        help="pgvector, planner plan: a filter admitting at most this many chunks is scored "
        "exactly (default: the store's EXACT_ROWS)",
    )
    parser.add_argument(
        "--own-index-rows",
        type=int,
        default=None,
        help="pgvector: a collection of more chunks gets its own HNSW index (default: "
        "retrieval.collection_indexes.OWN_INDEX_ROWS)",
    )
    parser.add_argument("--database-url", default=None, help="a PostgreSQL server with pgvector")
    parser.add_argument(
        "--force-hnsw",
        action="store_true",
        help="pgvector: only the HNSW index, even where an exact scan is cheaper (--plans hnsw)",
    )
    parser.add_argument(
        "--plans",
        default="planner",
        help="pgvector: comma-separated, measured one after the other on one load: `planner` "
        "(the served path) and `hnsw` (the index forced)",
    )
    args = parser.parse_args(argv)
    plans = ("hnsw",) if args.force_hnsw else tuple(args.plans.split(","))
    if not plans or set(plans) - {"planner", "hnsw"}:
        parser.error("--plans takes planner, hnsw or both")
    try:
        ef_searches = tuple(int(value) for value in args.ef_search.split(",") if value)
    except ValueError:
        parser.error("--ef-search takes integers, comma-separated")
    if ef_searches and min(ef_searches) < 1:
        parser.error("--ef-search values must be positive")
    if min(args.chunks, args.collections, args.queries, args.chunks_per_document) < 1:
        parser.error("--chunks, --collections, --queries, --chunks-per-document must be positive")
    if args.chunks < args.collections * max(TOP, args.chunks_per_document):
        parser.error(
            "every collection needs a document and 10 chunks: --chunks at least --collections "
            "times the larger of 10 and --chunks-per-document"
        )

    with tempfile.TemporaryDirectory(prefix="cachet-vector-bench-") as directory:
        scratch = Path(directory)
        with bench_database(args.store, scratch, args.database_url) as url:
            # NOTE: a private data dir and database, so the bench never touches real data.
            os.environ["CACHET_DATA_DIR"] = str(scratch)
            os.environ["DATABASE_URL"] = url
            os.environ["CACHET_VECTOR_STORE"] = args.store
            os.environ.setdefault("CACHET_SECRET_KEY", "vector-store-bench-throwaway-" + "x" * 32)
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
            import django

            django.setup()
            from django.core.management import call_command

            call_command("migrate", verbosity=0)
            logging.getLogger().setLevel(logging.WARNING)
            result = run_bench(
                args.store,
                num_chunks=args.chunks,
                num_collections=args.collections,
                num_queries=args.queries,
                chunks_per_document=args.chunks_per_document,
                ef_searches=ef_searches,
                plans=plans,
                exact_rows=args.exact_rows,
                own_index_rows=args.own_index_rows,
                m=args.m,
                ef_construction=args.ef_construction,
            )
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
