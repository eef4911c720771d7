"""`manage.py search "query"`: print the top-K chunks with scores and citations."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from retrieval.models import Collection
from retrieval.search import MODES, search


class Command(BaseCommand):
    help = "Search the indexed documents."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("query")
        parser.add_argument("--collection", action="append", default=None)
        parser.add_argument("--top-k", type=int, default=None)
        parser.add_argument("--mode", choices=MODES, default="hybrid+rerank")

    def handle(
        self,
        *args: Any,
        query: str,
        collection: list[str] | None,
        top_k: int | None,
        mode: str,
        **options: Any,
    ) -> None:
        collections = None
        if collection:
            collections = list(Collection.objects.filter(name__in=collection))
            missing = set(collection) - {c.name for c in collections}
            if missing:
                raise CommandError(f"no such collection: {', '.join(sorted(missing))}")
        try:
            hits = search(query, collections, top_k, mode=mode)
        except ValueError as error:
            raise CommandError(str(error)) from None
        for rank, hit in enumerate(hits, start=1):
            where = f"p.{hit.page}, " if hit.page else ""
            section = " > ".join(hit.heading_path)
            self.stdout.write(
                f"{rank}. [{hit.score:.4f}] {hit.document_title} ({where}chars "
                f"{hit.char_start}-{hit.char_end}){' ' + section if section else ''}"
            )
            self.stdout.write("   " + " ".join(hit.text.split())[:300])
        if not hits:
            self.stdout.write("no results")
