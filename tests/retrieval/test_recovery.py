"""retrieval.recovery: ingestions cut short by a crash are found by their free lock and run again.

In-process, on the embedded defaults (tasks run in-process). The real crashes — a Celery worker
and a server process killed with SIGKILL mid-ingestion — are in
tests/reliability/test_worker_kill.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from django.conf import settings
from django.core.files.base import ContentFile
from django.db import connection

from retrieval.ingest import ingest
from retrieval.ingestion_lock import ingestion_lock, lock_path
from retrieval.models import Chunk, Collection, Document
from retrieval.recovery import recover_interrupted_ingestions
from retrieval.tasks import enqueue_ingest, ingest_document
from tests.documents import HANDBOOK, KITCHEN, add_document

pytestmark = pytest.mark.django_db(transaction=True)

HOLD_LOCK = """
import fcntl, os, sys, time
descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(descriptor, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture(autouse=True)
def embedded_defaults():
    if settings.REDIS_URL:
        pytest.skip("tasks run in-process only on the embedded defaults")


def hold_lock_in_another_process(document_id: int) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock_path(document_id))],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def assert_index_matches_chunks(retriever) -> None:
    chunk_ids = set(Chunk.objects.values_list("id", flat=True))
    assert retriever.vectors.ids() == chunk_ids
    assert len(retriever.vectors) == len(chunk_ids)  # no id twice


def test_the_lock_of_a_killed_process_is_free(retriever) -> None:
    holder = hold_lock_in_another_process(7)
    try:
        with ingestion_lock(7, blocking=False) as is_free:
            assert not is_free
    finally:
        holder.kill()  # SIGKILL: the kernel releases its lock
        holder.wait()
    with ingestion_lock(7, blocking=False) as is_free:
        assert is_free
    assert not lock_path(7).exists()  # removed on release


def test_an_abandoned_document_is_ingested_again_and_a_locked_one_left_alone(retriever) -> None:
    collection = Collection.objects.create(name="ops")
    abandoned = add_document(collection, "handbook.md", HANDBOOK)
    running = add_document(collection, "kitchen.txt", KITCHEN)
    # What a killed run leaves: `processing` part-way; the live one holds its lock.
    Document.objects.filter(pk__in=[abandoned.pk, running.pk]).update(
        status=Document.Status.PROCESSING, progress=40
    )
    holder = hold_lock_in_another_process(running.pk)
    try:
        assert recover_interrupted_ingestions(include_queued=False) == [abandoned.pk]
    finally:
        holder.kill()
        holder.wait()
    abandoned.refresh_from_db()
    running.refresh_from_db()
    assert (abandoned.status, abandoned.progress) == (Document.Status.READY, 100)
    assert (running.status, running.progress) == (Document.Status.PROCESSING, 40)
    assert Chunk.objects.filter(document=abandoned).count() == 2
    assert_index_matches_chunks(retriever)


def test_queued_documents_are_ingested_again_only_when_asked(retriever) -> None:
    document = add_document(Collection.objects.create(name="ops"), "kitchen.txt", KITCHEN)
    assert document.status == Document.Status.QUEUED
    assert recover_interrupted_ingestions(include_queued=False) == []
    assert recover_interrupted_ingestions(include_queued=True) == [document.pk]
    document.refresh_from_db()
    assert document.status == Document.Status.READY
    assert recover_interrupted_ingestions(include_queued=True) == []


def test_a_message_delivered_again_after_the_work_is_done_changes_nothing(retriever) -> None:
    document = add_document(Collection.objects.create(name="ops"), "handbook.md", HANDBOOK)
    ingest_document.delay(document.pk).get()
    first = list(Chunk.objects.values_list("id", flat=True))
    # The repeated delivery: the document is `ready` from the same file.
    assert ingest_document.delay(document.pk).get()["status"] == "ready"
    assert list(Chunk.objects.values_list("id", flat=True)) == first
    # A re-ingest asked for (status `queued` first) runs again: new chunk ids.
    enqueue_ingest(document)
    document.refresh_from_db()
    assert document.status == Document.Status.READY
    second = list(Chunk.objects.values_list("id", flat=True))
    assert len(second) == len(first) and not set(second) & set(first)
    # A replaced file is ingested even if the document still says `ready`.
    document.file.save("new.txt", ContentFile(KITCHEN.encode()), save=True)
    assert ingest_document.delay(document.pk).get()["status"] == "ready"
    assert [c.text for c in Chunk.objects.filter(document=document)] == [KITCHEN]
    assert_index_matches_chunks(retriever)


def test_two_runs_of_one_document_do_not_overlap(retriever) -> None:
    document = add_document(Collection.objects.create(name="ops"), "handbook.md", HANDBOOK)
    errors = []

    def run() -> None:
        try:
            ingest(document.pk, retriever)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    document.refresh_from_db()
    assert document.status == Document.Status.READY
    assert Chunk.objects.filter(document=document).count() == 2
    assert_index_matches_chunks(retriever)
