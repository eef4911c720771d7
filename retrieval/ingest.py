"""The ingestion pipeline of one document: read, extract, chunk, embed, store, index.

Running it twice leaves the same chunks and vectors: the document's old chunks and their vectors
are replaced, never added to. The database is written in one transaction, the vectors too where
they live in it (pgvector); a faiss index right after, and a crash between the two leaves a
mismatch that start-up repair (`consistency.py`) fixes.
Staff may cancel a run: it stops at its next stage or embedding batch (`cancellation.py`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils.translation import gettext_noop

from retrieval.cancellation import IngestionCancelled, advance, discard
from retrieval.chunking import ChunkDraft, chunk_sections
from retrieval.extract import ExtractionError, extract, mime_type_for
from retrieval.ingestion_lock import ingestion_lock
from retrieval.models import Chunk, Document
from retrieval.postings import StatsDeltas, delete_chunks, index_chunks
from retrieval.progress import publish, report
from retrieval.reasons import Reason
from retrieval.search import Retriever, get_retriever

logger = logging.getLogger(__name__)

Status = Document.Status


@dataclass(slots=True)
class Prepared:
    document: Document
    drafts: list[ChunkDraft]


def max_upload_bytes() -> int:
    return settings.CACHET_MAX_UPLOAD_MB * 1024 * 1024


def prepare(document: Document, retriever: Retriever) -> Prepared:
    """Read, check, extract and chunk; raises ExtractionError with a readable reason."""
    name = document.file.name
    if not name:
        raise ExtractionError(gettext_noop("The document has no file."))
    try:
        with document.file.open("rb") as handle:
            data = handle.read(max_upload_bytes() + 1)
    except FileNotFoundError:
        raise ExtractionError(gettext_noop("The uploaded file is missing from storage.")) from None
    if len(data) > max_upload_bytes():
        raise ExtractionError(
            gettext_noop("The file is larger than the upload limit of %(limit)s MB."),
            limit=settings.CACHET_MAX_UPLOAD_MB,
        )
    document.size_bytes = len(data)
    document.content_hash = hashlib.sha256(data).hexdigest()
    document.mime_type = mime_type_for(name)
    Document.objects.filter(pk=document.pk).update(
        size_bytes=document.size_bytes,
        content_hash=document.content_hash,
        mime_type=document.mime_type,
    )
    sections = extract(data, name)
    drafts = chunk_sections(
        sections,
        retriever.embedder.tokenizer,
        settings.CACHET_CHUNK_TOKENS,
        settings.CACHET_CHUNK_OVERLAP,
    )
    return Prepared(document, drafts)


def store(prepared: Prepared) -> tuple[list[int], list[int]]:
    """Replace the document's chunks in one transaction; returns (old ids, new ids).

    Raises IngestionCancelled, writing nothing, if the document was cancelled meanwhile.
    """
    document = prepared.document
    with transaction.atomic():
        # BM25's postings change with the chunks, their statistics once at the end
        # (retrieval.postings says why).
        deltas = StatsDeltas()
        old_ids = delete_chunks(Chunk.objects.filter(document=document), deltas)
        created = Chunk.objects.bulk_create(
            Chunk(
                document=document,
                ordinal=ordinal,
                text=draft.text,
                token_count=draft.token_count,
                char_start=draft.char_start,
                char_end=draft.char_end,
                page=draft.page,
                heading_path=draft.heading_path,
            )
            for ordinal, draft in enumerate(prepared.drafts)
        )
        index_chunks(created, deltas)
        deltas.apply()
        new_ids = [chunk.pk for chunk in created]
        is_ready = (
            Document.objects.filter(pk=document.pk)
            .exclude(status=Status.CANCELLED)
            .update(status=Status.READY, progress=100, error="", error_reason={})
        )
        if not is_ready:
            raise IngestionCancelled(document.pk)  # rolls the chunks back
    return old_ids, new_ids


def embed(
    retriever: Retriever,
    texts: Sequence[str],
    on_batch: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    batch = max(1, retriever.embedder.batch_size)
    parts = []
    for start in range(0, len(texts), batch):
        parts.append(retriever.embedder.encode(list(texts[start : start + batch])))
        if on_batch is not None:
            on_batch(min(start + batch, len(texts)), len(texts))
    if not parts:
        return np.zeros((0, retriever.embedder.dimension), np.float32)
    return np.concatenate(parts)


def fail(document: Document, reason: Reason | str) -> None:
    """Mark failed, saying why (`retrieval.reasons`; a str is a message without values), and drop
    any chunks and vectors an earlier run left.

    A document cancelled meanwhile stays cancelled: staff stopped it, whatever went wrong after.
    """
    old_ids = delete_chunks(Chunk.objects.filter(document=document))
    if isinstance(reason, str):
        reason = Reason(reason)
    error, error_reason = reason.english(), reason.as_json()
    has_failed = (
        Document.objects.filter(pk=document.pk)
        .exclude(status=Status.CANCELLED)
        .update(status=Status.FAILED, progress=0, error=error, error_reason=error_reason)
    )
    if has_failed:
        document.status, document.progress = Status.FAILED, 0
        document.error, document.error_reason = error, error_reason
    else:
        document.status, document.progress = Status.CANCELLED, 0
        document.error, document.error_reason = "", {}
    publish(document)
    if old_ids:
        get_retriever().vectors.remove(old_ids)


def ingest(
    document_id: int, retriever: Retriever, *, skip_if_ingested: bool = False
) -> Document | None:
    """Ingest one document; expected failures end as `failed` with a reason, not an exception.

    Runs under the document's ingestion lock (`retrieval.ingestion_lock`): a second run of the same
    document waits for the first. `skip_if_ingested` (the Celery task): a document already
    `ready` from the same file is left as it is. Every request to ingest sets `queued` first, so
    finding it `ready` means another run did the work: a message delivered again after a crash.
    """
    with ingestion_lock(document_id):
        return _ingest(document_id, retriever, skip_if_ingested)


def _is_ingested(document: Document) -> bool:
    if document.status != Status.READY or not document.content_hash or not document.file:
        return False
    try:
        with document.file.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return False
    return digest == document.content_hash


def _ingest(document_id: int, retriever: Retriever, skip_if_ingested: bool) -> Document | None:
    document = Document.objects.filter(pk=document_id).first()
    if document is None:
        logger.info("document %s no longer exists; nothing to ingest", document_id)
        return None
    if skip_if_ingested and _is_ingested(document):
        logger.info("document %s is already ingested from this file; nothing to do", document_id)
        return document
    if document.status == Status.CANCELLED:
        logger.info("document %s was cancelled; nothing to ingest", document_id)
        discard(document)  # what a run before this one left, if its cancel found it locked
        return document
    try:
        return _run(document, retriever)
    except IngestionCancelled:
        logger.info("document %s: ingestion stopped, it was cancelled", document_id)
        if Document.objects.filter(pk=document_id).exists():
            discard(document)
            return document
        return None


def _run(document: Document, retriever: Retriever) -> Document:
    """The stages; each step forward checks for a cancel (`advance`)."""
    document_id = document.pk
    advance(document, 1)
    try:
        prepared = prepare(document, retriever)
    except ExtractionError as error:
        logger.info("document %s failed: %s", document_id, error)
        fail(document, error.reason)
        return document
    advance(document, 10)
    last = [10]

    def on_batch(done: int, total: int) -> None:
        # NOTE: every batch checks for a cancel (one indexed UPDATE); progress shows in 5% steps.
        percent = 10 + int(85 * done / max(total, 1))
        if percent - last[0] >= 5 or done == total:
            last[0] = percent
        advance(document, last[0])

    vectors = embed(retriever, [d.text for d in prepared.drafts], on_batch)
    # NOTE: a store in the database (pgvector) writes the vectors in the chunks' transaction, so
    # both are there or neither; a faiss file is written right after it commits.
    with transaction.atomic():
        old_ids, new_ids = store(prepared)
        if retriever.vectors.in_database:
            retriever.vectors.replace(old_ids, new_ids, vectors)
    if not retriever.vectors.in_database:
        retriever.vectors.replace(old_ids, new_ids, vectors)
    report(document, Status.READY, 100)
    logger.info("document %s ready: %d chunks", document_id, len(new_ids))
    return document
