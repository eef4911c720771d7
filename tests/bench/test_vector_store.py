"""bench.vector_store: the dense-search-at-scale harness runs end to end at small sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--chunks", "400", "--collections", "4", "--queries", "5")


def run_bench(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "bench.vector_store", *SMALL, *args],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_the_faiss_store_is_measured_against_exact_search() -> None:
    report = run_bench("--store", "faiss")
    assert report["store"].startswith("faiss: ") and report["chunks"] == 400
    exact = report["plans"]["exact"]
    for kind in ("unfiltered", "filtered"):
        assert exact[kind]["recall_at_10"] == 1.0  # a flat index is exact
        assert 0 <= exact[kind]["total_ms"]["p50"] <= exact[kind]["total_ms"]["p95"]
    assert exact["filtered"]["filter_ids_ms"]["mean"] > 0  # the chunk ids read first
    assert exact["unfiltered"]["filter_ids_ms"]["mean"] == 0


def test_the_pgvector_store_is_measured_through_its_hnsw_index(bundled_postgres) -> None:
    report = run_bench(
        "--store", "pgvector", "--plans", "planner,hnsw", "--database-url", bundled_postgres.url()
    )
    assert report["store"].startswith("pgvector: ") and report["chunks"] == 400
    assert report["index_build_s"] is not None and report["load_vectors_per_s"] > 0
    assert report["collections_with_own_index"] == 0  # NOTE: 100 chunks each, far too few
    forced, served = report["plans"]["hnsw"], report["plans"]["planner"]
    index = "retrieval_chunk_embedding_hnsw"
    assert forced["hnsw_indexes_used"] == {"unfiltered": [index], "filtered": [index]}
    # served, a collection of 100 chunks is scored exactly (the index: the planner's choice)
    assert served["hnsw_indexes_used"]["filtered"] == []
    assert served["filtered"]["recall_at_10"] == 1.0
    for kind in ("unfiltered", "filtered"):
        for plan in (forced, served):
            assert plan[kind]["recall_at_10"] >= 0.9
            assert plan[kind]["filter_ids_ms"]["p50"] == 0  # the filter is in the query
    with psycopg.connect(bundled_postgres.url()) as connection:  # its database is gone
        names = connection.execute("SELECT datname FROM pg_database").fetchall()
    assert ("cachet_bench_vectors",) not in names


def test_large_collections_are_measured_through_their_own_indexes(bundled_postgres) -> None:
    report = run_bench(
        "--store", "pgvector", "--plans", "planner,hnsw", "--chunks", "800", "--collections",
        "8", "--own-index-rows", "50", "--exact-rows", "50", "--database-url",
        bundled_postgres.url(),
    )  # fmt: skip
    assert report["collections_with_own_index"] == 8
    assert report["collection_index_build_s"] is not None
    served, forced = report["plans"]["planner"], report["plans"]["hnsw"]
    index = "retrieval_chunk_embedding_hnsw"
    # NOTE: the planner's choice at 100 chunks may be an exact read; either way, never the
    # whole table's index for collections that have their own
    for kind in ("filtered", "filtered_3"):
        used = served["hnsw_indexes_used"][kind]
        assert index not in used and all(name.startswith(f"{index}_c") for name in used), used
        assert forced["hnsw_indexes_used"][kind] == [index]
        assert served[kind]["recall_at_10"] >= 0.9
