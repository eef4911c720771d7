"""Deleting a document (or its collection) removes its vectors from the index after commit."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from retrieval.models import Chunk, Document

logger = logging.getLogger(__name__)


@receiver(pre_delete, sender=Document)
def remove_vectors_of_deleted_document(
    sender: type[Document], instance: Document, **kwargs: Any
) -> None:
    chunk_ids = list(Chunk.objects.filter(document=instance).values_list("id", flat=True))
    storage, name = instance.file.storage, instance.file.name
    if name:
        transaction.on_commit(lambda: storage.delete(name))
    if not chunk_ids:
        return

    def remove() -> None:
        from retrieval.search import get_retriever

        get_retriever().vectors.remove(chunk_ids)

    transaction.on_commit(remove)
