"""Celery tasks of the retrieval app."""

from __future__ import annotations

import logging
from pathlib import Path

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import UploadedFile
from django.db import InterfaceError, OperationalError, transaction
from django.utils.translation import gettext, gettext_noop
from kombu.exceptions import OperationalError as BrokerError

from retrieval.collection_indexes import update_collection_indexes
from retrieval.ingest import fail, ingest
from retrieval.models import Collection, Document
from retrieval.reasons import Reason
from retrieval.search import get_retriever

logger = logging.getLogger(__name__)

# NOTE: errors worth retrying are those of services that come back: the database and the broker.
# NOTE: InterfaceError: the worker's connection closed under it (the server restarted).
TRANSIENT_ERRORS = (OperationalError, InterfaceError, ConnectionError, TimeoutError)
SOFT_TIME_LIMIT_S = 30 * 60
MAX_RETRIES = 3
# A collection's index check that finds another build under way tries again this often.
INDEX_RETRY_DELAY_S = 120
INDEX_RETRIES = 20
# The start of a document's error when its ingestion could not be queued (see `was_not_queued`).
NOT_QUEUED = "Could not queue the ingestion"
NOT_QUEUED_REASON = gettext_noop(
    "Could not queue the ingestion: the task broker is unreachable (%(error)s). "
    "Re-ingest the document once it is back."
)

# What `ingest_document` returns: the document's id, its final status, and its error if failed.
TaskResult = dict[str, int | str]


@shared_task(
    bind=True,
    name="retrieval.ingest_document",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=SOFT_TIME_LIMIT_S,
    time_limit=SOFT_TIME_LIMIT_S + 60,
    max_retries=MAX_RETRIES,
)
def ingest_document(self: Task[[int], TaskResult], document_id: int) -> TaskResult:
    """Ingest one document by id (re-fetched; idempotent). Returns its final status."""
    try:
        # NOTE: a message delivered again after a crash finds the document already ingested.
        document = ingest(document_id, get_retriever(), skip_if_ingested=True)
    except TRANSIENT_ERRORS as error:
        if self.request.retries >= MAX_RETRIES:
            _fail_quietly(
                document_id,
                Reason(
                    gettext_noop("Gave up after %(retries)s retries: %(error)s"),
                    {"retries": MAX_RETRIES, "error": str(error)},
                ),
            )
            raise
        logger.warning("ingesting document %s hit %s; retrying", document_id, error)
        raise self.retry(exc=error, countdown=2 ** (self.request.retries + 1)) from error
    except SoftTimeLimitExceeded:
        _fail_quietly(
            document_id,
            Reason(
                gettext_noop("Ingestion took longer than %(minutes)s minutes."),
                {"minutes": SOFT_TIME_LIMIT_S // 60},
            ),
        )
        raise
    except Exception as error:
        # NOTE: one bad file must not take down the worker or other documents; record why.
        logger.exception("ingesting document %s failed", document_id)
        document = Document.objects.filter(pk=document_id).first()
        if document is not None:
            reason = Reason(
                gettext_noop("Internal error while ingesting: %(type)s: %(error)s"),
                {"type": type(error).__name__, "error": str(error)},
            )
            fail(document, reason)
        raise
    if document is None:
        return {"document_id": document_id, "status": "deleted"}
    if document.status == Document.Status.READY and get_retriever().vectors.in_database:
        enqueue_collection_index(document.collection_id)
    return {"document_id": document_id, "status": document.status, "error": document.error}


@shared_task(
    bind=True,
    name="retrieval.index_collection",
    ignore_result=True,
    max_retries=INDEX_RETRIES,
    default_retry_delay=INDEX_RETRY_DELAY_S,
)
def index_collection(self: Task[[int], None], collection_id: int) -> None:
    """Give the collection an HNSW index of its own if it has grown past
    `collection_indexes.OWN_INDEX_ROWS` chunks (pgvector; see `retrieval.collection_indexes`).

    NOTE: while another process builds, a worker does not wait (a build takes minutes, and
    every ingestion queues this task): it tries again later, freeing its slot. In process (no
    broker) it waits. Failures are logged, not raised: searches work without the index
    (through the whole table's), and the next ingestion or `manage.py index_collections` tries
    again.
    """
    try:
        done = update_collection_indexes([collection_id], wait=bool(self.request.is_eager))
    except Exception:
        logger.exception("could not update collection %s's own vector index", collection_id)
        return
    if done is None:
        if self.request.retries < INDEX_RETRIES:
            raise self.retry()
        logger.warning("collection %s's index check gave up: another build ran", collection_id)
    elif done.built or done.dropped:
        logger.info("collection indexes: built for %s, dropped for %s", done.built, done.dropped)


def enqueue_collection_index(collection_id: int) -> None:
    try:
        index_collection.apply_async((collection_id,), ignore_result=True)
    except BrokerError as error:
        logger.warning("could not queue collection %s's index check: %s", collection_id, error)


def _fail_quietly(document_id: int, reason: Reason) -> None:
    try:
        document = Document.objects.filter(pk=document_id).first()
        if document is not None:
            fail(document, reason)
    except Exception:
        logger.exception("could not mark document %s failed", document_id)


def enqueue_ingest(document: Document) -> None:
    """Queue the document for ingestion once the surrounding transaction commits."""
    Document.objects.filter(pk=document.pk).update(
        status=Document.Status.QUEUED, progress=0, error="", error_reason={}
    )
    document.status, document.progress = Document.Status.QUEUED, 0
    document.error, document.error_reason = "", {}
    document_id = document.pk
    transaction.on_commit(lambda: _publish(document_id))


def _publish(document_id: int) -> None:
    try:
        # NOTE: nobody waits for an ingestion's result (progress lives on the row). Without
        # ignore_result the sender subscribes to every task's result in the Redis result
        # backend, which leaks subscriptions and, while Redis is down, retries for 20 s.
        ingest_document.apply_async((document_id,), ignore_result=True)
    except BrokerError as error:
        # NOTE: not raised: the upload is saved, and other documents of the same transaction
        # must still be queued. The document says why; callers answer with a clear error.
        reason = Reason(NOT_QUEUED_REASON, {"error": str(error)})
        logger.warning("document %s: %s", document_id, reason.english())
        Document.objects.filter(pk=document_id).update(
            status=Document.Status.FAILED,
            progress=0,
            error=reason.english(),
            error_reason=reason.as_json(),
        )
    except Exception:
        if not settings.CELERY_TASK_ALWAYS_EAGER:
            raise
        # NOTE: in-process tasks (no broker) raise the ingestion's own error here, inside the
        # upload's request; the task has already marked the document failed with the reason, and
        # the upload itself succeeded, so the uploader gets its 201 and reads the status.
        logger.warning("in-process ingestion of document %s failed", document_id)


def was_not_queued(document: Document) -> bool:
    """After the upload's transaction: True if the broker refused its ingestion task."""
    document.refresh_from_db(fields=["status", "progress", "error", "error_reason"])
    return document.status == Document.Status.FAILED and document.error.startswith(NOT_QUEUED)


def drop_unqueued(documents: list[Document]) -> str | None:
    """Delete the uploads whose ingestion the broker refused; a message saying why (in the active
    language), or None.

    For the upload endpoints, which then answer 503: the client tries again later, with no
    half-made document left behind.
    """
    unqueued = [document for document in documents if was_not_queued(document)]
    if not unqueued:
        return None
    for document in unqueued:
        document.delete()
    reason = Reason.from_json(unqueued[0].error_reason)
    broker_error = str(reason.params.get("error", "")) if reason is not None else ""
    return gettext(
        "The upload was not kept: the task broker is unreachable (%(error)s). Try again shortly."
    ) % {"error": broker_error}


def add_upload(collection: Collection, upload: UploadedFile[bytes], user: User | None) -> Document:
    """Store an uploaded file as a new document of `collection` and queue its ingestion."""
    if not upload.name:
        raise ValueError("an upload without a file name cannot be stored")
    document = Document.objects.create(
        collection=collection,
        title=Path(upload.name).name,
        file=upload,
        size_bytes=upload.size or 0,
        created_by=user,
    )
    enqueue_ingest(document)
    return document
