"""retrieval.cancellation: a cancelled ingestion stops, leaves no chunks or vectors, stays put.

Real embedder, real faiss. The run and the cancel meet only in the database: a run in another
thread of this process, and (integration pass: PostgreSQL, a throwaway Redis) a real Celery
worker process.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from retrieval.cancellation import cancel
from retrieval.ingest import ingest
from retrieval.ingestion_lock import ingestion_lock
from retrieval.models import Chunk, Collection, Document
from retrieval.recovery import recover_interrupted_ingestions
from retrieval.tasks import ingest_document
from tests.celery_workers import send_ingest, start_worker, stop_worker, worker_env
from tests.documents import HANDBOOK, KITCHEN, add_document
from tests.reliability.helpers import ThrowawayRedis, big_document, index_ids, wait_for
from tests.reliability.test_worker_kill import (
    INGEST_TIMEOUT_S,
    PARAGRAPHS,
    mid_embedding,
    postgres_only,
)

pytestmark = pytest.mark.django_db(transaction=True)

Status = Document.Status
# Long enough to be caught mid-embedding on any machine: ~300 chunks, many batches.
LONG_TEXT = "\n\n".join(
    f"## Section {n}\n"
    + " ".join(f"Paragraph {n} sentence {m} about item {n * m}." for m in range(40))
    for n in range(120)
)


def test_a_queued_document_cancelled_is_never_ingested_and_its_task_does_nothing(retriever):
    document = add_document(Collection.objects.create(name="ops"), "kitchen.md", KITCHEN)
    cancelled = cancel(document.pk)
    assert cancelled.status == Status.CANCELLED
    assert ingest_document.apply(args=(document.pk,)).get()["status"] == "cancelled"
    assert not Chunk.objects.filter(document=document).exists()
    assert retriever.vectors.ids() == set()


def test_cancel_stops_a_running_ingestion_between_batches_and_removes_what_it_made(retriever):
    collection = Collection.objects.create(name="ops")
    kept = add_document(collection, "kitchen.md", KITCHEN)
    ingest(kept.pk, retriever)
    document = add_document(collection, "long.md", LONG_TEXT)
    finished = []

    def run() -> None:
        try:
            finished.append(ingest(document.pk, retriever))
        finally:
            connection.close()

    runner = threading.Thread(target=run)
    runner.start()
    wait_for(lambda: Document.objects.get(pk=document.pk).progress > 10, 120, "the first batches")
    assert cancel(document.pk).status == Status.CANCELLED
    runner.join(120)
    assert not runner.is_alive()
    document.refresh_from_db()
    assert document.status == Status.CANCELLED and document.progress < 100
    assert finished[0].status == Status.CANCELLED
    assert not Chunk.objects.filter(document=document).exists()
    # NOTE: only the other document's vectors are left: nothing half-indexed.
    assert retriever.vectors.ids() == set(Chunk.objects.values_list("id", flat=True))
    assert Chunk.objects.filter(document=kept).exists()


def test_cancelling_a_reingest_removes_the_old_chunks_and_vectors_too(retriever):
    document = add_document(Collection.objects.create(name="ops"), "handbook.md", HANDBOOK)
    ingest(document.pk, retriever)
    assert retriever.vectors.ids()
    Document.objects.filter(pk=document.pk).update(status=Status.QUEUED)  # to be re-ingested
    cancel(document.pk)
    assert not Chunk.objects.filter(document=document).exists()
    assert retriever.vectors.ids() == set()


def test_a_finished_document_cannot_be_cancelled(retriever):
    document = add_document(Collection.objects.create(name="ops"), "kitchen.md", KITCHEN)
    ingest(document.pk, retriever)
    assert cancel(document.pk).status == Status.READY
    assert Chunk.objects.filter(document=document).count() == 1
    assert cancel(10_000) is None


def test_recovery_at_start_never_queues_a_cancelled_document_again(retriever):
    collection = Collection.objects.create(name="ops")
    document = add_document(collection, "handbook.md", HANDBOOK)
    ingest(document.pk, retriever)
    # A run that was cancelled, then died before removing the chunks of an earlier ingestion.
    Document.objects.filter(pk=document.pk).update(status=Status.CANCELLED, progress=0)
    assert recover_interrupted_ingestions(include_queued=True) == []
    document.refresh_from_db()
    assert document.status == Status.CANCELLED
    assert not Chunk.objects.filter(document=document).exists()
    assert retriever.vectors.ids() == set()


def test_a_cancel_while_a_run_holds_the_lock_leaves_the_cleanup_to_that_run(retriever):
    document = add_document(Collection.objects.create(name="ops"), "kitchen.md", KITCHEN)
    ingest(document.pk, retriever)
    Document.objects.filter(pk=document.pk).update(status=Status.PROCESSING)
    with ingestion_lock(document.pk):
        cancel(document.pk)
        # The run would stop at its next step; until then its old chunks are not searchable.
        assert Chunk.objects.filter(document=document).exists()
    assert ingest(document.pk, retriever).status == Status.CANCELLED
    assert not Chunk.objects.filter(document=document).exists()
    assert retriever.vectors.ids() == set()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_stops_a_cancelled_ingestion_and_skips_a_cancelled_queued_one(
    settings, tmp_path
) -> None:
    """Redis/Celery mode: the run is a worker process of its own; only the database joins them."""
    postgres_only(settings)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    settings.DATA_DIR, settings.MEDIA_ROOT = data_dir, data_dir / "media"
    collection = Collection.objects.create(name="worker-cancel")
    running = add_document(collection, "records.txt", big_document(PARAGRAPHS))
    waiting = add_document(collection, "waiting.md", KITCHEN)
    cancel(waiting.pk)  # cancelled before its message is even sent
    with ThrowawayRedis(tmp_path) as broker:
        log_path = tmp_path / "worker.log"
        worker = start_worker(
            worker_env(settings, data_dir, broker.url), log_path, "--pool", "solo"
        )
        try:
            send_ingest(broker.url, running.pk)
            send_ingest(broker.url, waiting.pk)
            wait_for(lambda: mid_embedding(running.pk), INGEST_TIMEOUT_S, "the first batches")
            assert cancel(running.pk).status == Status.CANCELLED
            wait_for(
                lambda: "was cancelled; nothing to ingest" in log_path.read_text(),
                INGEST_TIMEOUT_S,
                "the cancelled queued document's turn",
            )
        finally:
            stop_worker(worker)
        log = log_path.read_text()
    assert f"document {running.pk}: ingestion stopped, it was cancelled" in log
    for document in (running, waiting):
        document.refresh_from_db()
        assert document.status == Status.CANCELLED
        assert not Chunk.objects.filter(document=document).exists()
    index_path = data_dir / "index" / "chunks.faiss"
    assert not index_path.exists() or index_ids(index_path) == []
