"""Ingestion throughput with one Celery worker, then two, on PostgreSQL with pgvector.

A scale-out deployment's set-up (README "Production"): vectors in pgvector, BM25 in PostgreSQL
(`CACHET_VECTOR_STORE=pgvector`, `CACHET_LEXICAL_STORE=postgresql`), Redis as the broker and
solo-pool workers (`harness.celery_worker`), on a throwaway database (`bench.throwaway_database`:
`--database-url`'s server, or the bundled PostgreSQL with pgvector) and a Redis database of its
own (`--redis-db`, flushed). The documents are real text (`bench.ingestion_documents`).

Each round starts from empty tables (the retrieval app's, truncated) with fresh workers, waits
until every worker has loaded its model, then uploads the same documents through `add_upload`
(what the upload endpoints call: the file stored, the task queued on commit) and times from the
first upload until every document is ready. Rounds: one worker with as many torch threads as
cores; two workers splitting the cores (cores // 2 threads each, at least one: together they
run as many threads as one did, rather than more OpenMP threads than cores); with
`--default-threads`, two workers at torch's default (one thread a core each). Ingestion records
no time per stage, so the stages are timed afterwards in this process on `--stage-sample`
documents with one worker's threads. Prints JSON on stdout and a table on stderr.

    nice -n 19 python -m bench.ingestion_workers --documents 200 --default-threads
    python -m bench.ingestion_workers --smoke    # a handful of documents: checks the harness
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.ingestion_documents import Upload, expected_chunks, make_uploads, time_stages
from bench.throwaway_database import throwaway_database
from harness import cpu_name
from harness.celery_worker import start_worker, stop_worker, wait_until_ready

logger = logging.getLogger(__name__)

POLL_S = 0.2
WORKER_READY_TIMEOUT_S = 300.0
# Celery's line when a task returns, with the task's own seconds in the worker.
TASK_SUCCEEDED = re.compile(r"retrieval\.ingest_document\[[^\]]+\] succeeded in ([0-9.]+)s")
# Dropped from the workers' environment: each round sets the threads itself.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CACHET_TORCH_THREADS")


@dataclass(frozen=True, slots=True)
class Setup:
    num_workers: int
    torch_threads: int  # per worker (CACHET_TORCH_THREADS); 0: torch's default, one a core


def empty_tables(data_dir: Path, redis_url: str) -> None:
    """Every retrieval table truncated, the uploaded files and the broker's queue gone.

    NOTE: the pgvector store's state table is no model and stays: it names the embedding model,
    as in a deployment that has run before; the first round finds it made by this process.
    """
    import shutil

    import redis
    from django.apps import apps
    from django.db import connection

    models = apps.get_app_config("retrieval").get_models(include_auto_created=True)
    tables = ", ".join(model._meta.db_table for model in models)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    shutil.rmtree(data_dir / "media", ignore_errors=True)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()


def workers_cpu_s(workers: list[subprocess.Popen[bytes]]) -> float | None:
    """The workers' user + system CPU seconds, all their threads (Linux /proc), or None."""
    total = 0.0
    for worker in workers:
        try:
            fields = Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def upload_and_wait(uploads: list[Upload], timeout_s: float) -> tuple[list[int], float, float]:
    """Upload every document, then wait until none is queued or processing:
    (document ids, seconds uploading, seconds from the first upload to the last one done)."""
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.db import transaction

    from retrieval.models import Collection, Document
    from retrieval.tasks import add_upload

    collection = Collection.objects.create(name="ingestion bench")
    began = time.perf_counter()
    ids = []
    for upload in uploads:
        with transaction.atomic():  # NOTE: as an upload request: queued when it commits
            file = SimpleUploadedFile(upload.name, upload.data, "text/markdown")
            ids.append(add_upload(collection, file, None).pk)
    upload_s = time.perf_counter() - began
    active = (Document.Status.QUEUED, Document.Status.PROCESSING)
    pending = Document.objects.filter(pk__in=ids, status__in=active)
    while pending.exists() and time.perf_counter() - began < timeout_s:
        time.sleep(POLL_S)
    return ids, upload_s, time.perf_counter() - began


def outcome(ids: list[int], uploads: list[Upload], expected: list[int]) -> dict[str, Any]:
    """What the round left: documents not ready, chunk counts against `expected`, vectors."""
    from django.db import connection
    from django.db.models import Count

    from retrieval.models import Document
    from retrieval.pgvector_store import COLUMN, TABLE

    documents = Document.objects.filter(pk__in=ids).annotate(num_chunks=Count("chunks"))
    found = {d.title: d for d in documents}
    wanted = {upload.name: count for upload, count in zip(uploads, expected, strict=True)}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE {COLUMN} IS NULL")
        (chunks_without_vector,) = cursor.fetchone()
    return {
        "ready": sum(d.status == Document.Status.READY for d in documents),
        "not_ready": [
            {"name": d.title, "status": d.status, "error": d.error[:200]}
            for d in documents
            if d.status != Document.Status.READY
        ][:10],
        "chunks": sum(d.num_chunks for d in documents),
        "expected_chunks": sum(expected),
        "wrong_chunk_counts": {
            name: [found[name].num_chunks if name in found else None, count]
            for name, count in wanted.items()
            if name not in found or found[name].num_chunks != count
        },
        "chunks_without_vector": chunks_without_vector,
    }


def run_round(
    setup: Setup,
    uploads: list[Upload],
    expected: list[int],
    env: dict[str, str],
    *,
    data_dir: Path,
    redis_url: str,
    timeout_s: float,
) -> dict[str, Any]:
    """One worker count and thread setting, from empty tables to every document done."""
    empty_tables(data_dir, redis_url)
    label = f"workers{setup.num_workers}-threads{setup.torch_threads}"
    logs = [data_dir / f"{label}-{i}.log" for i in range(setup.num_workers)]
    worker_env = env | {"CACHET_TORCH_THREADS": str(setup.torch_threads)}
    workers = [start_worker(worker_env, log, f"bench{i}@%h") for i, log in enumerate(logs)]
    try:
        for worker, log in zip(workers, logs, strict=True):
            wait_until_ready(worker, log, WORKER_READY_TIMEOUT_S)
        cpu_before = workers_cpu_s(workers)
        load_before = os.getloadavg()[0]
        ids, upload_s, elapsed_s = upload_and_wait(uploads, timeout_s)
        cpu_after = workers_cpu_s(workers)
        load_after = os.getloadavg()[0]
    finally:
        for worker in workers:
            stop_worker(worker)
    result = outcome(ids, uploads, expected)
    task_s = [float(s) for log in logs for s in TASK_SUCCEEDED.findall(log.read_text("utf-8"))]
    cpu_s = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return {
        "workers": setup.num_workers,
        "torch_threads_per_worker": setup.torch_threads or "default",
        "documents": len(ids),
        **result,
        "timed_out": elapsed_s >= timeout_s,
        "upload_s": round(upload_s, 2),
        "elapsed_s": round(elapsed_s, 2),
        "documents_per_s": round(len(ids) / elapsed_s, 3),
        "chunks_per_s": round(result["chunks"] / elapsed_s, 2),
        # NOTE: per task, in the worker: with two workers on shared cores each task is slower.
        "task_s": summary(task_s),
        "tasks_logged": len(task_s),
        # The workers' own CPU (PostgreSQL's and Redis's not counted), over the timed span.
        "worker_cpu_s": None if cpu_s is None else round(cpu_s, 1),
        "worker_cores_busy": None if cpu_s is None else round(cpu_s / elapsed_s, 2),
        "load_avg_1m": [round(load_before, 2), round(load_after, 2)],
    }


def summary(samples: list[float]) -> dict[str, float] | None:
    if not samples:
        return None
    return {
        "mean": round(float(np.mean(samples)), 3),
        "p50": round(float(np.percentile(samples, 50)), 3),
        "p95": round(float(np.percentile(samples, 95)), 3),
    }


def torch_default_threads(env: dict[str, str]) -> int:
    """How many threads torch takes by default in a process started with `env` (a worker's)."""
    probe = "import torch; print(torch.get_num_threads())"
    output = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout
    return int(output.strip())


def setups(num_cores: int, default_threads: bool) -> list[Setup]:
    """One worker on every core; two splitting them; two at torch's default if asked."""
    rounds = [Setup(1, num_cores), Setup(2, max(1, num_cores // 2))]
    return [*rounds, Setup(2, 0)] if default_threads else rounds


def ratios(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Each two-worker round's documents a second over the one-worker round's."""
    one = rounds[0]
    return {
        f"2 workers x {r['torch_threads_per_worker']} threads / 1 worker x "
        f"{one['torch_threads_per_worker']}": round(
            r["documents_per_s"] / one["documents_per_s"], 3
        )
        for r in rounds[1:]
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        "workers  threads/worker  docs/s  chunks/s  elapsed s  task s (mean)  worker cores busy",
    ]
    for r in report["rounds"]:
        task = r["task_s"]["mean"] if r["task_s"] else float("nan")
        lines.append(
            f"{r['workers']:>7}  {r['torch_threads_per_worker']!s:>14}  "
            f"{r['documents_per_s']:>6.3f}  {r['chunks_per_s']:>8.2f}  {r['elapsed_s']:>9.1f}  "
            f"{task:>13.2f}  {r['worker_cores_busy']!s:>17}"
        )
    lines += [f"{name}: {value}" for name, value in report["ratio_to_one_worker"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ingestion_workers", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--passages-per-document", type=int, default=10)
    parser.add_argument(
        "--default-threads",
        action="store_true",
        help="a third round: two workers at torch's default threads (one a core each)",
    )
    parser.add_argument("--stage-sample", type=int, default=20, help="documents timed by stage")
    parser.add_argument(
        "--database-url",
        default=None,
        help="a PostgreSQL server with pgvector (its database is ignored); default: the bundled "
        "one",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0",
        help="the Redis server for the broker (its database number is replaced by --redis-db)",
    )
    parser.add_argument("--redis-db", type=int, default=11, help="flushed at every round")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per round")
    parser.add_argument("--smoke", action="store_true", help="4 documents of 3 passages")
    args = parser.parse_args(argv)
    if args.smoke:
        args.documents, args.passages_per_document, args.stage_sample = 4, 3, 4
    if min(args.documents, args.passages_per_document, args.stage_sample) < 1:
        parser.error("--documents, --passages-per-document and --stage-sample must be positive")
    try:
        uploads = make_uploads(args.documents, args.passages_per_document)
    except ValueError as error:
        parser.error(str(error))
    redis_url = f"{args.redis_url.rsplit('/', 1)[0]}/{args.redis_db}"
    num_cores = len(os.sched_getaffinity(0))

    with (
        tempfile.TemporaryDirectory(prefix="cachet-ingestion-bench-") as directory,
        throwaway_database(f"cachet_bench_ingestion_{os.getpid()}", args.database_url) as url,
    ):
        data_dir = Path(directory)
        # NOTE: a private data dir, database and Redis database: the bench never touches real data.
        env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES} | {
            "CACHET_DATA_DIR": str(data_dir),
            "DATABASE_URL": url,
            "REDIS_URL": redis_url,
            "CACHET_VECTOR_STORE": "pgvector",
            "CACHET_LEXICAL_STORE": "postgresql",
            "CACHET_SECRET_KEY": "ingestion-bench-throwaway-" + "x" * 32,
            "DJANGO_SETTINGS_MODULE": "chatsite.settings",
            "HF_HUB_OFFLINE": "1",
        }
        default_threads = torch_default_threads(env)
        os.environ.update(env)
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command

        from retrieval.search import get_retriever

        call_command("migrate", verbosity=0)
        logging.getLogger().setLevel(logging.WARNING)
        # NOTE: made here first, so every round's workers find the store as set up.
        tokenizer = get_retriever().embedder.tokenizer
        expected = [expected_chunks(upload, tokenizer) for upload in uploads]
        rounds = []
        for setup in setups(num_cores, args.default_threads):
            logger.warning("round: %s", setup)
            rounds.append(
                run_round(
                    setup,
                    uploads,
                    expected,
                    env,
                    data_dir=data_dir,
                    redis_url=redis_url,
                    timeout_s=args.timeout_s,
                )
            )
        empty_tables(data_dir, redis_url)
        stage_threads = setups(num_cores, False)[0].torch_threads
        stage_uploads = uploads[: args.stage_sample]
        stage_s = time_stages(stage_uploads, stage_threads)
        report = {
            "documents": len(uploads),
            "passages_per_document": args.passages_per_document,
            "bytes": sum(len(upload.data) for upload in uploads),
            "expected_chunks": sum(expected),
            "chunk_tokens": settings.CACHET_CHUNK_TOKENS,
            "embedding_model": get_retriever().embedder.model_id,
            "stores": "pgvector, postgresql",
            "cores": num_cores,
            "torch_default_threads": default_threads,
            "rounds": rounds,
            "ratio_to_one_worker": ratios(rounds),
            "stages": {
                "documents": len(stage_uploads),
                "torch_threads": stage_threads,
                "seconds": {name: round(s, 2) for name, s in stage_s.items()},
                "share": {name: round(s / sum(stage_s.values()), 3) for name, s in stage_s.items()},
            },
            "cpu": cpu_name(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
    json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    sys.stderr.write(table(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
