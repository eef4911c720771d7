"""Shared helpers of the retrieval tests: a retriever whose index lives in a temporary data dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.files.base import ContentFile

import retrieval.search as search_module
from retrieval.models import Collection, Document

HANDBOOK = (
    "# Handbook\n## Leave\nEvery employee gets thirty days of paid holiday each year.\n"
    "## Travel\nTrains are preferred over flights for trips shorter than 600 kilometres.\n"
)
KITCHEN = "The office kitchen is cleaned every Friday afternoon by the facilities team."


@pytest.fixture
def retriever(settings, tmp_path: Path):
    """The process retriever, rebuilt on a fresh data dir (real embedder, real faiss)."""
    settings.DATA_DIR = tmp_path
    settings.MEDIA_ROOT = tmp_path / "media"
    search_module._retriever = None
    yield search_module.get_retriever()
    search_module._retriever = None


def add_document(collection: Collection, name: str, content: bytes | str) -> Document:
    data = content.encode() if isinstance(content, str) else content
    return Document.objects.create(
        collection=collection, title=name, file=ContentFile(data, name=name)
    )
