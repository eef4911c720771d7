"""bench.lexical_store: the BM25-at-scale harness runs end to end at smoke sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from bench.lexical_store import load_sentences_and_queries

ROOT = Path(__file__).resolve().parents[2]


def test_chunks_are_drawn_from_real_english_and_chinese_sentences() -> None:
    sentences, queries = load_sentences_and_queries(30)
    assert len(queries) == 30 and len(sentences) > 2000
    assert any("apt-get" in s for s in sentences) and any("。" in s for s in sentences)


@pytest.mark.integration
@pytest.mark.django_db
@pytest.mark.parametrize("load", [[], ["--bulk-load"]], ids=["through store()", "bulk"])
def test_a_smoke_run_stores_every_chunk_and_both_stores_agree(load: list[str]) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("runs in the integration pass (DATABASE_URL=postgres://...)")
    before = bench_databases()
    result = subprocess.run(
        [sys.executable, "-m", "bench.lexical_store", "--smoke", *load],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert (report["chunks"], report["queries"]) == (300, 10)
    postgres = report["postgresql_ms"]
    assert 0 < postgres["all collections"]["p50"] <= postgres["all collections"]["p95"]
    assert report["bm25s_ms"]["rebuild_ms"] > 0
    # The same scores rank by rank; chunk ids may differ only where scores tie at the cut.
    assert report["top10_max_relative_score_difference"] < 1e-5
    assert report["top10_overlap_postgresql_vs_bm25s"] >= 0.95
    assert bench_databases() == before  # its throwaway database is gone again


def bench_databases() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'cachet_lexical_bench%%'"
        )
        return {name for (name,) in cursor.fetchall()}
