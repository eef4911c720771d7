"""bench.ingestion_workers: one worker, then two, ingest the same real documents end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench.ingestion_documents import make_uploads

ROOT = Path(__file__).resolve().parents[2]
# NOTE: a Redis database of its own, flushed by the bench (the deploy tests have 12 and 13, a
# real run of the bench 11).
REDIS_DB = "10"


def test_documents_are_consecutive_real_passages_under_their_article_headings() -> None:
    uploads = make_uploads(3, 4)
    assert [u.name for u in uploads] == [f"passages-000{i}.md" for i in range(3)]
    text = uploads[0].data.decode()
    assert text.startswith("# ") and text.count("\n\n") >= 4  # a heading, then four passages
    assert len({u.data for u in uploads}) == 3
    with pytest.raises(ValueError, match="passages asked for"):
        make_uploads(10**6, 10)


@pytest.mark.integration
def test_a_smoke_run_makes_every_document_ready_in_each_round_and_reports_the_ratio(
    request,
) -> None:
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        pytest.skip("runs in the integration pass (REDIS_URL=redis://...)")
    bundled_postgres = request.getfixturevalue("bundled_postgres")  # after the skip: not started
    result = subprocess.run(
        [sys.executable, "-m", "bench.ingestion_workers", "--smoke",
         "--database-url", bundled_postgres.url(), "--redis-url", redis_url,
         "--redis-db", REDIS_DB],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    rounds = report["rounds"]
    cores = report["cores"]
    assert [(r["workers"], r["torch_threads_per_worker"]) for r in rounds] == [
        (1, cores),
        (2, max(1, cores // 2)),
    ]
    assert report["expected_chunks"] > report["documents"] == 4
    for r in rounds:
        assert (r["documents"], r["ready"], r["not_ready"], r["timed_out"]) == (4, 4, [], False)
        # every document chunked as its text must be, each chunk with its vector
        assert r["wrong_chunk_counts"] == {}, r
        assert r["chunks"] == r["expected_chunks"] == report["expected_chunks"]
        assert r["chunks_without_vector"] == 0
        assert r["tasks_logged"] == 4  # one task a document, each run once
        assert r["documents_per_s"] > 0 and r["worker_cpu_s"] > 0
    ratio = report["ratio_to_one_worker"]
    assert list(ratio.values()) == [
        round(rounds[1]["documents_per_s"] / rounds[0]["documents_per_s"], 3)
    ]
    assert report["stages"]["seconds"]["embed"] > 0
    assert "workers" in result.stderr and "/ 1 worker" in result.stderr  # the table
    with psycopg.connect(bundled_postgres.url()) as connection:  # its database is gone
        names = connection.execute("SELECT datname FROM pg_database").fetchall()
    assert not [name for (name,) in names if name.startswith("cachet_bench_ingestion")]
