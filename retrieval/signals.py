"""Deleting a document (or its collection) removes its BM25 postings in the same transaction
and its vectors from the index after commit."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from retrieval.models import Chunk, Document
from retrieval.postings import remove_chunks

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
    # NOTE: in the deletion's transaction (pre_delete runs inside it), before the chunks go;
    # exclusive, as a collection's documents are removed one by one (retrieval.postings).
    remove_chunks(chunk_ids, exclusive=True)

    def remove() -> None:
        from retrieval.search import get_retriever

        get_retriever().vectors.remove(chunk_ids)

    transaction.on_commit(remove)
