"""Documents the tests ingest: two short texts, and `add_document` to store one in a collection."""

from __future__ import annotations

from django.core.files.base import ContentFile

from retrieval.models import Collection, Document

HANDBOOK = (
    "# Handbook\n## Leave\nEvery employee gets thirty days of paid holiday each year.\n"
    "## Travel\nTrains are preferred over flights for trips shorter than 600 kilometres.\n"
)
KITCHEN = "The office kitchen is cleaned every Friday afternoon by the facilities team."


def add_document(collection: Collection, name: str, content: bytes | str) -> Document:
    """A document row holding `content` as the uploaded file `name`; `queued`, not yet ingested."""
    data = content.encode() if isinstance(content, str) else content
    return Document.objects.create(
        collection=collection, title=name, file=ContentFile(data, name=name)
    )
