"""Ingestion progress: saved on the Document row and pushed to the channel group `document.<id>`.

A browser (the admin's upload list, the chat UI) subscribed to that group gets messages of type
`document.progress` with `document_id`, `status`, `progress` (0-100), `error` (English) and
`error_reason` (the same in no language, `retrieval.reasons`: the consumer shows it in its page's).
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from retrieval.models import Document

logger = logging.getLogger(__name__)


def group_name(document_id: int) -> str:
    return f"document.{document_id}"


def report(document: Document, status: str, progress: int, error: str = "") -> None:
    document.status = status
    document.progress = max(0, min(100, progress))
    document.error, document.error_reason = error, {}
    Document.objects.filter(pk=document.pk).update(
        status=document.status, progress=document.progress, error=error, error_reason={}
    )
    publish(document)


def publish(document: Document) -> None:
    """Send the document's state, as set on `document`, to its group (the row is saved already)."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {
        "type": "document.progress",
        "document_id": document.pk,
        "status": document.status,
        "progress": document.progress,
        "error": document.error,
        "error_reason": document.error_reason,
    }
    try:
        async_to_sync(layer.group_send)(group_name(document.pk), message)
    except Exception as exc:  # NOTE: a live bar is a nicety; never fail an ingestion over it.
        logger.warning("could not push progress of document %s: %s", document.pk, exc)
