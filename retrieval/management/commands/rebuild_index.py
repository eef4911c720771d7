"""`manage.py rebuild_index`: re-embed every ready chunk into the vector store (a fresh faiss
index, or the pgvector column, in one transaction)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from retrieval.consistency import rebuild_index
from retrieval.search import get_retriever


class Command(BaseCommand):
    help = "Re-embed every ready chunk into the vector store (faiss or pgvector)."

    def handle(self, *args: Any, **options: Any) -> None:
        count = rebuild_index(get_retriever())
        self.stdout.write(f"index rebuilt: {count} vectors")
