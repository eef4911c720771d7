"""Cancelling an ingestion: the document's status is the flag, in the database.

`cancel()` is one conditional UPDATE, queued or processing -> cancelled. A run moves its progress
on between stages and embedding batches with an UPDATE that skips cancelled rows (`advance`): no
row updated means the document was cancelled (or deleted), and the run stops with
`IngestionCancelled`. Its last write, the chunks and `ready`, is in one transaction whose status
UPDATE skips cancelled rows too (`retrieval.ingest.store`), so a cancel that wins that race leaves
no chunks, and one that loses finds the document ready, nothing left to cancel.

Because the flag is a row, this works the same with tasks run in-process (the run in another
request's thread) and in a Celery worker on another machine; a queued task that starts later
finds its document cancelled and does nothing, so no revoke is needed (a revoke lives only in
the memory of the workers running when it is sent). A cancelled document holds no chunks or
vectors: the run removes them when it stops, or `cancel()` itself when no run holds the
document's ingestion lock (still queued, or its run died). Start-up recovery never queues a
cancelled document again (`retrieval.recovery`).
"""

from __future__ import annotations

import logging

from retrieval.ingestion_lock import ingestion_lock
from retrieval.models import Chunk, Document
from retrieval.postings import delete_chunks
from retrieval.progress import publish
from retrieval.search import get_retriever

logger = logging.getLogger(__name__)

Status = Document.Status
CANCELLABLE = (Status.QUEUED, Status.PROCESSING)
RETRYABLE = (Status.FAILED, Status.CANCELLED)


class IngestionCancelled(Exception):
    """The document of a running ingestion was cancelled or deleted meanwhile."""


def cancel(document_id: int) -> Document | None:
    """Cancel the document's ingestion if it is queued or running; None if there is no document.

    Returns the document as it is afterwards: `cancelled`, or unchanged when it had already
    finished (the caller tells the two apart by its status).
    """
    cancelled = Document.objects.filter(pk=document_id, status__in=CANCELLABLE).update(
        status=Status.CANCELLED, progress=0, error=""
    )
    document = Document.objects.select_related("collection").filter(pk=document_id).first()
    if not cancelled or document is None:
        return document
    logger.info("document %s: ingestion cancelled", document_id)
    with ingestion_lock(document_id, blocking=False) as is_free:
        if is_free:  # no run to stop: clean up here
            discard(document)
    return document


def discard(document: Document) -> None:
    """Remove a cancelled document's chunks and vectors, and tell its watchers."""
    old_ids = delete_chunks(Chunk.objects.filter(document=document))
    if old_ids:
        get_retriever().vectors.remove(old_ids)
    document.status, document.progress, document.error = Status.CANCELLED, 0, ""
    publish(document)


def advance(document: Document, progress: int) -> None:
    """Save a run's progress; raises IngestionCancelled if the document was cancelled or deleted."""
    progress = max(0, min(100, progress))
    moved = (
        Document.objects.filter(pk=document.pk)
        .exclude(status=Status.CANCELLED)
        .update(status=Status.PROCESSING, progress=progress, error="")
    )
    if not moved:
        raise IngestionCancelled(document.pk)
    is_news = (document.status, document.progress) != (Status.PROCESSING, progress)
    document.status, document.progress, document.error = Status.PROCESSING, progress, ""
    if is_news:
        publish(document)


def discard_cancelled_leftovers() -> list[int]:
    """Clean cancelled documents whose run died before it removed their chunks; their ids."""
    cleaned = []
    leftovers = Document.objects.filter(status=Status.CANCELLED, chunks__isnull=False).distinct()
    for document in leftovers:
        with ingestion_lock(document.pk, blocking=False) as is_free:
            if is_free:
                discard(document)
                cleaned.append(document.pk)
    return cleaned
