"""`manage.py rebuild_index`: re-embed every ready chunk into a fresh faiss index."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from retrieval.consistency import rebuild_index
from retrieval.search import get_retriever


class Command(BaseCommand):
    help = "Rebuild the vector index from the chunks in the database."

    def handle(self, *args: Any, **options: Any) -> None:
        count = rebuild_index(get_retriever())
        self.stdout.write(f"index rebuilt: {count} vectors")
