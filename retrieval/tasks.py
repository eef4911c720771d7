"""Celery tasks of the retrieval app."""

from __future__ import annotations

import logging
from pathlib import Path

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.uploadedfile import UploadedFile
from django.db import OperationalError, transaction

from retrieval.models import Collection, Document

logger = logging.getLogger(__name__)

# NOTE: errors worth retrying are those of services that come back: the database and the broker.
TRANSIENT_ERRORS = (OperationalError, ConnectionError, TimeoutError)
SOFT_TIME_LIMIT_S = 30 * 60


@shared_task(
    bind=True,
    name="retrieval.ingest_document",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=SOFT_TIME_LIMIT_S,
    time_limit=SOFT_TIME_LIMIT_S + 60,
    max_retries=3,
)
def ingest_document(self, document_id: int) -> dict:
    """Ingest one document by id (re-fetched; idempotent). Returns its final status."""
    from retrieval.ingest import fail, ingest
    from retrieval.search import get_retriever

    try:
        document = ingest(document_id, get_retriever())
    except TRANSIENT_ERRORS as error:
        if self.request.retries >= self.max_retries:
            _fail_quietly(document_id, f"Gave up after {self.max_retries} retries: {error}")
            raise
        logger.warning("ingesting document %s hit %s; retrying", document_id, error)
        raise self.retry(exc=error, countdown=2 ** (self.request.retries + 1)) from error
    except SoftTimeLimitExceeded:
        _fail_quietly(document_id, f"Ingestion took longer than {SOFT_TIME_LIMIT_S // 60} minutes.")
        raise
    except Exception as error:
        # NOTE: one bad file must not take down the worker or other documents; record why.
        logger.exception("ingesting document %s failed", document_id)
        document = Document.objects.filter(pk=document_id).first()
        if document is not None:
            fail(document, f"Internal error while ingesting: {type(error).__name__}: {error}")
        raise
    if document is None:
        return {"document_id": document_id, "status": "deleted"}
    return {"document_id": document_id, "status": document.status, "error": document.error}


def _fail_quietly(document_id: int, reason: str) -> None:
    from retrieval.ingest import fail

    try:
        document = Document.objects.filter(pk=document_id).first()
        if document is not None:
            fail(document, reason)
    except Exception:
        logger.exception("could not mark document %s failed", document_id)


def enqueue_ingest(document: Document) -> None:
    """Queue the document for ingestion once the surrounding transaction commits."""
    Document.objects.filter(pk=document.pk).update(
        status=Document.Status.QUEUED, progress=0, error=""
    )
    document.status, document.progress, document.error = Document.Status.QUEUED, 0, ""
    document_id = document.pk
    transaction.on_commit(lambda: ingest_document.delay(document_id))


def add_upload(
    collection: Collection, upload: UploadedFile, user: AbstractBaseUser | None
) -> Document:
    """Store an uploaded file as a new document of `collection` and queue its ingestion."""
    document = Document.objects.create(
        collection=collection,
        title=Path(upload.name).name,
        file=upload,
        size_bytes=upload.size,
        created_by=user,
    )
    enqueue_ingest(document)
    return document
