"""Faults: a Celery worker killed with SIGKILL mid-ingestion, and a server killed mid-ingestion.

After the crash the document ends `ready` with exactly the chunks of a clean ingestion of the same
file, and the faiss index holds exactly their vector ids, each once.

- Integration pass (PostgreSQL; the broker is a throwaway redis-server of the test's own, so a
  message left behind never reaches the shared Redis):
  - the whole worker killed (solo pool): its message stays unacknowledged in Redis until the
    broker's visibility timeout (one hour); the next worker to start finds the document
    `processing` with a free ingestion lock and queues it again (`retrieval.recovery`). When the
    old message does come back, that delivery finds the document ingested and changes nothing.
  - the pool child killed (prefork): the parent requeues the message at once
    (`acks_late` + `reject_on_worker_lost`) and a new child ingests it.
- Default pass (embedded defaults: SQLite, tasks run in the server process): a LiveServer killed
  while an upload is being ingested; the server started again on the same data dir finishes it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.files.base import ContentFile

from harness import LiveServer
from retrieval.models import Chunk, Collection, Document
from tests.celery_workers import send_ingest, start_worker, stop_worker, worker_env
from tests.reliability.helpers import (
    ThrowawayRedis,
    big_document,
    clean_chunk_texts,
    index_ids,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
# Three embedding batches of 64 chunks: progress goes 10, 38, 66, 95, so a kill after the first
# batch lands mid-embedding (a few seconds on two cores).
PARAGRAPHS = 192
DOCUMENT = big_document(PARAGRAPHS)
NAME = "records.txt"
INGEST_TIMEOUT_S = 300


def postgres_only(settings) -> None:
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.skip("runs in the integration pass (DATABASE_URL=postgres://...): the worker "
                    "process must see the test database")  # fmt: skip


def state(document_id: int) -> tuple[str, int]:
    return Document.objects.filter(pk=document_id).values_list("status", "progress").get()


def mid_embedding(document_id: int):
    status, progress = state(document_id)
    assert status != Document.Status.READY, "the ingestion ended before the kill; enlarge it"
    return status == Document.Status.PROCESSING and progress > 10


def is_ready(document_id: int):
    status, _ = state(document_id)
    assert status != Document.Status.FAILED, Document.objects.get(pk=document_id).error
    return status == Document.Status.READY


def assert_clean_ingestion(document: Document, index_path: Path) -> list[int]:
    """The chunks are exactly a clean ingestion's; the index holds each of their ids once."""
    chunks = list(Chunk.objects.filter(document=document).order_by("ordinal"))
    assert [c.text for c in chunks] == clean_chunk_texts(DOCUMENT, NAME)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    chunk_ids = sorted(c.pk for c in chunks)
    assert sorted(index_ids(index_path)) == chunk_ids
    return chunk_ids


@pytest.fixture
def broker(tmp_path):
    with ThrowawayRedis(tmp_path) as redis_server:
        yield redis_server


@pytest.fixture
def upload(settings, tmp_path):
    """A data dir shared with the workers, and the big document in it, `queued`."""
    postgres_only(settings)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    settings.DATA_DIR, settings.MEDIA_ROOT = data_dir, data_dir / "media"
    collection = Collection.objects.create(name=f"kill-{uuid.uuid4().hex[:8]}")
    document = Document.objects.create(
        collection=collection, title=NAME, file=ContentFile(DOCUMENT, name=NAME)
    )
    return data_dir, document


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_ingestion_is_recovered_by_the_next_worker(
    settings, tmp_path, broker, upload
) -> None:
    data_dir, document = upload
    env = worker_env(settings, data_dir, broker.url)
    log_path = tmp_path / "workers.log"
    first = start_worker(env, log_path, "--pool", "solo")
    try:
        send_ingest(broker.url, document.pk)
        wait_for(lambda: mid_embedding(document.pk), INGEST_TIMEOUT_S, "the first batches")
    finally:
        stop_worker(first, signal.SIGKILL)
    assert state(document.pk)[0] == Document.Status.PROCESSING
    # The killed run's message waits in Redis for the visibility timeout (one hour).
    assert broker.client().hlen("unacked") == 1

    second = start_worker(env, log_path, "--pool", "solo")
    try:
        wait_for(lambda: is_ready(document.pk), INGEST_TIMEOUT_S, "ready")
        index_path = data_dir / "index" / "chunks.faiss"
        chunk_ids = assert_clean_ingestion(document, index_path)
        log = log_path.read_text()
        assert f"document {document.pk} was left processing" in log

        # The old message comes back (here at once: a visibility timeout of 0 restores it).
        from kombu import Connection

        with Connection(broker.url, transport_options={"visibility_timeout": 0}) as connection:
            connection.default_channel.qos.restore_visible()
        wait_for(
            lambda: f"document {document.pk} is already ingested" in log_path.read_text(),
            60,
            "the repeated delivery",
        )
        wait_for(lambda: broker.client().hlen("unacked") == 0, 30, "the message's ack")
    finally:
        stop_worker(second)
    assert state(document.pk) == (Document.Status.READY, 100)
    assert assert_clean_ingestion(document, index_path) == chunk_ids  # untouched


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_pool_child_killed_mid_ingestion_is_redelivered_at_once(
    settings, tmp_path, broker, upload
) -> None:
    data_dir, document = upload
    log_path = tmp_path / "worker.log"
    worker = start_worker(
        worker_env(settings, data_dir, broker.url), log_path, "--pool", "prefork",
        "--concurrency", "1",
    )  # fmt: skip
    try:
        send_ingest(broker.url, document.pk)
        wait_for(lambda: mid_embedding(document.pk), INGEST_TIMEOUT_S, "the first batches")
        children = subprocess.run(
            ["pgrep", "-P", str(worker.pid)], capture_output=True, text=True, check=True
        ).stdout.split()
        assert len(children) == 1
        os.kill(int(children[0]), signal.SIGKILL)
        wait_for(lambda: is_ready(document.pk), INGEST_TIMEOUT_S, "ready")
        wait_for(lambda: broker.client().hlen("unacked") == 0, 30, "the message's ack")
    finally:
        stop_worker(worker)
    log = log_path.read_text()
    assert "signal 9 (SIGKILL)" in log, log[-3000:]
    assert_clean_ingestion(document, data_dir / "index" / "chunks.faiss")


# ---- the server killed (embedded defaults: the upload's ingestion runs in the server) ----

SETUP = """
from django.contrib.auth.models import User
from api.models import ApiKey
from retrieval.models import Collection

staff = User.objects.create_user("uploader", is_staff=True)
collection = Collection.objects.create(name="Records")
_, key = ApiKey.create_for(staff, "uploads")
print(collection.pk, key)
"""


def upload_over_api(live: LiveServer, key: str, collection_id: int, outcome: dict) -> None:
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="collection"\r\n\r\n'
            f'{collection_id}\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{NAME}"\r\nContent-Type: text/plain\r\n\r\n'
        ).encode()
        + DOCUMENT
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        f"{live.url}/v1/documents",
        data=body,
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=INGEST_TIMEOUT_S) as response:
            outcome["answer"] = json.load(response)
    except OSError as error:  # the server was killed under the request
        outcome["error"] = error


def document_rows(live: LiveServer) -> list[tuple[int, str, int]]:
    with sqlite3.connect(live.data_dir / "cachet.sqlite3", timeout=20) as database:
        return database.execute(
            "SELECT id, status, progress FROM retrieval_document ORDER BY id"
        ).fetchall()


def chunk_texts(live: LiveServer, document_id: int) -> list[tuple[int, int, str]]:
    with sqlite3.connect(live.data_dir / "cachet.sqlite3", timeout=20) as database:
        return database.execute(
            "SELECT id, ordinal, text FROM retrieval_chunk WHERE document_id = ? ORDER BY ordinal",
            (document_id,),
        ).fetchall()


@pytest.mark.real_weights
def test_a_server_killed_mid_ingestion_loses_no_document(chat_model_dir) -> None:
    if django_settings.REDIS_URL:
        pytest.skip("the embedded defaults (no REDIS_URL) run ingestion in the server process")
    with LiveServer(models_dir=chat_model_dir.parent, torch_threads=1) as live:
        collection_id, key = live.shell(SETUP).split()
        live.start()
        outcome: dict = {}
        uploader = threading.Thread(
            target=upload_over_api, args=(live, key, int(collection_id), outcome)
        )
        uploader.start()

        def killed_mid_embedding():
            rows = document_rows(live)
            assert not rows or rows[0][1] != "ready", "the ingestion ended before the kill"
            return rows and rows[0][1] == "processing" and rows[0][2] > 10

        wait_for(killed_mid_embedding, INGEST_TIMEOUT_S, "the first batches", interval_s=0.1)
        live.kill()
        uploader.join(60)
        assert "error" in outcome  # the upload's request died with the server
        [(document_id, status, _)] = document_rows(live)
        assert status == "processing"

        live.start()  # a new server on the same data dir: its start-up check finishes the job
        wait_for(
            lambda: document_rows(live)[0][1] == "ready", INGEST_TIMEOUT_S, "ready", interval_s=0.5
        )
        chunks = chunk_texts(live, document_id)
        assert [c[2] for c in chunks] == clean_chunk_texts(DOCUMENT, NAME)
        assert [c[1] for c in chunks] == list(range(len(chunks)))
        assert sorted(index_ids(live.data_dir / "index" / "chunks.faiss")) == sorted(
            c[0] for c in chunks
        )
        assert "was left processing" in live.log_tail(20_000)
