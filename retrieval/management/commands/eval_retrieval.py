"""`manage.py eval_retrieval DIR`: score bm25, dense, hybrid and hybrid+rerank on a BEIR set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from retrieval.evaluation import evaluate
from retrieval.rerank import make_reranker


class Command(BaseCommand):
    help = "Evaluate retrieval on a BEIR-layout directory; prints one JSON object."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory")
        parser.add_argument("--max-queries", type=int, default=None)
        parser.add_argument("--reranker", default=None, help="default: CACHET_RERANKER")

    def handle(
        self,
        *args: Any,
        directory: str,
        max_queries: int | None,
        reranker: str | None,
        **options: Any,
    ) -> None:
        try:
            result = evaluate(
                Path(directory),
                max_queries=max_queries,
                reranker=make_reranker(reranker or settings.CACHET_RERANKER),
                candidates=settings.CACHET_SEARCH_CANDIDATES,
            )
        except (FileNotFoundError, ValueError) as error:
            raise CommandError(str(error)) from None
        self.stdout.write(json.dumps(result, indent=2))
