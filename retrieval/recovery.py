"""Ingestions cut short by a crash (a killed worker or server) are found and queued again.

While a document is ingested, the run holds an exclusive lock (`flock`) on a file of its own
under the data dir (`retrieval.ingestion_lock`); the kernel releases it however the process
ends, SIGKILL included. So a document left `processing` whose lock is free was abandoned by a
process that died, and one that is locked is being ingested right now. The lock also keeps two
runs of one document (a message delivered twice, a re-ingest while one runs) from overlapping:
the second waits for the first.

`recover_interrupted_ingestions()` runs where ingestion runs: in a Celery worker when it starts
(`retrieval.apps`), and in the web server when it starts with tasks run in-process (no
`REDIS_URL`; `chatsite.asgi`). With a broker, the message of the killed run also stays in Redis
until the broker's visibility timeout (one hour) and is delivered again then; that repeated
delivery finds the document already ingested from the same file and does nothing
(`retrieval.ingest.ingest(..., skip_if_ingested=True)`).
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import connections

from retrieval.cancellation import discard_cancelled_leftovers
from retrieval.ingestion_lock import ingestion_lock
from retrieval.models import Document
from retrieval.search import get_retriever
from retrieval.tasks import ingest_document

logger = logging.getLogger(__name__)

Status = Document.Status


def recover_interrupted_ingestions(*, include_queued: bool) -> list[int]:
    """Queue again every document whose ingestion was cut short; returns their ids.

    `processing` with a free lock: its run died. `include_queued`: also `queued` documents, for
    tasks run in-process, where a queued document has no message waiting anywhere (a server
    killed between the upload's commit and its ingestion). With a broker a queued document's
    message is still in the queue, so it is left alone.
    """
    # NOTE: cancelled documents are never queued again; one whose run died before it removed
    # its chunks is cleaned here.
    discard_cancelled_leftovers()
    statuses = [Status.PROCESSING, *([Status.QUEUED] if include_queued else [])]
    candidates = list(
        Document.objects.filter(status__in=statuses).order_by("pk").values_list("pk", flat=True)
    )
    recovered = []
    for document_id in candidates:
        with ingestion_lock(document_id, blocking=False) as is_free:
            if not is_free:
                continue  # a live process is ingesting it
            # NOTE: read again under the lock: the run may have finished since the query.
            was = (
                Document.objects.filter(pk=document_id, status__in=statuses)
                .values_list("status", "progress")
                .first()
            )
            if was is None:
                continue
            Document.objects.filter(pk=document_id).update(
                status=Status.QUEUED, progress=0, error=""
            )
        logger.warning(
            "document %s was left %s at %d%% by an interrupted ingestion; queuing it again",
            document_id,
            *was,
        )
        recovered.append(document_id)
        try:
            # NOTE: in-process, this runs the ingestion here and now.
            ingest_document.apply_async((document_id,), ignore_result=True)
        except Exception:
            # NOTE: the task records its own failures on the document; this is the broker
            # refusing the message, or an in-process run raising. The next start tries again.
            logger.exception("could not queue document %s again", document_id)
    return recovered


def check_at_start() -> None:
    """The server's start-up check: the index against the database, then interrupted ingestions.

    Runs in a background thread (`start_check_in_background`), so the server answers meanwhile.
    """
    try:
        get_retriever()  # builds the retriever, which checks and repairs the index
        if settings.CELERY_TASK_ALWAYS_EAGER:
            recover_interrupted_ingestions(include_queued=True)
    except Exception:
        logger.exception("the retrieval start-up check failed")
    finally:
        connections.close_all()  # this thread's connection


def start_check_in_background() -> threading.Thread:
    thread = threading.Thread(target=check_at_start, name="retrieval-start-check", daemon=True)
    thread.start()
    return thread
