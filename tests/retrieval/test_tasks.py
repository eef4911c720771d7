"""retrieval.tasks: ingestion through Celery, in-process and through a real worker on Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from retrieval.models import Chunk, Collection, Document
from retrieval.tasks import enqueue_ingest, ingest_document
from tests.documents import add_document

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_enqueued_ingestion_runs_on_commit_and_is_idempotent(
    retriever,
    django_capture_on_commit_callbacks,
) -> None:
    if settings.REDIS_URL:
        pytest.skip("only on the embedded defaults")
    document = add_document(Collection.objects.create(name="c"), "a.txt", "Alpha beta gamma.")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        enqueue_ingest(document)
    document.refresh_from_db()
    assert document.status == Document.Status.QUEUED and len(callbacks) == 1
    callbacks[0]()
    document.refresh_from_db()
    assert document.status == Document.Status.READY
    result = ingest_document.delay(document.pk).get(timeout=60)
    assert result == {"document_id": document.pk, "status": "ready", "error": ""}
    assert Chunk.objects.filter(document=document).count() == 1
    assert retriever.vectors.ids() == set(Chunk.objects.values_list("id", flat=True))


@pytest.mark.django_db
def test_a_deleted_document_is_a_no_op(retriever) -> None:
    if settings.REDIS_URL:
        pytest.skip("only on the embedded defaults")
    assert ingest_document.delay(123456).get(timeout=30)["status"] == "deleted"


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_ingests_through_redis(tmp_path, settings) -> None:
    if not settings.REDIS_URL:
        pytest.skip("runs in the integration pass (REDIS_URL=redis://...)")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "CACHET_DATA_DIR": str(data_dir),
    }
    # NOTE: the worker must see the test database, which pytest-django created with a prefix.
    db = settings.DATABASES["default"]
    env["DATABASE_URL"] = (
        f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        if "postgresql" in db["ENGINE"]
        else env.get("DATABASE_URL", "")
    )
    settings.MEDIA_ROOT = data_dir / "media"
    collection = Collection.objects.create(name="worker")
    good = add_document(collection, "notes.txt", "Redis carries the ingestion task.")
    bad = add_document(collection, "bad.docx", b"not a docx")
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "chatsite", "worker",
            "--pool", "solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", "INFO",
        ],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        results = [ingest_document.delay(d.pk).get(timeout=180) for d in (good, bad)]
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        log, _ = worker.communicate(timeout=30)
    assert results[0]["status"] == "ready", log[-3000:]
    assert results[1]["status"] == "failed" and "corrupt" in results[1]["error"]
    assert Chunk.objects.filter(document=good).count() == 1
    assert (data_dir / "index" / "chunks.faiss").is_file()
    assert "retrieval.ingest_document" in log
    time.sleep(0)
