"""`manage.py eval_retrieval DIR`: score bm25, dense, hybrid and hybrid+rerank on a BEIR set
(`--modes` picks some; `--lexical-store bm25s,postgresql` scores each with both BM25 stores)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.model_files import ModelSourceError
from retrieval.embeddings import get_embedder
from retrieval.evaluation import evaluate
from retrieval.lexical_store import lexical_store_name
from retrieval.rerank import make_reranker
from retrieval.search import MODES


class Command(BaseCommand):
    help = "Evaluate retrieval on a BEIR-layout directory; prints one JSON object."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory")
        parser.add_argument("--max-queries", type=int, default=None)
        parser.add_argument("--reranker", default=None, help="default: CACHET_RERANKER")
        parser.add_argument(
            "--modes",
            default=",".join(MODES),
            help=f"comma-separated, of {', '.join(MODES)} (default: all)",
        )
        parser.add_argument(
            "--lexical-store",
            default=None,
            help="comma-separated lexical stores (bm25s, postgresql) to score each mode with, "
            "over one ingestion; default: the configured one (CACHET_LEXICAL_STORE)",
        )
        parser.add_argument(
            "--embedding-model",
            default=None,
            help="a packaged name, a directory or a hub id; default: CACHET_EMBEDDING_MODEL",
        )

    def handle(
        self,
        *args: Any,
        directory: str,
        max_queries: int | None,
        reranker: str | None,
        embedding_model: str | None,
        modes: str,
        lexical_store: str | None,
        **options: Any,
    ) -> None:
        chosen = tuple(mode.strip() for mode in modes.split(",") if mode.strip())
        unknown = [mode for mode in chosen if mode not in MODES]
        if unknown or not chosen:
            raise CommandError(f"--modes: expected some of {', '.join(MODES)}; got {modes!r}")
        stores = None
        if lexical_store is not None:
            stores = tuple(name.strip() for name in lexical_store.split(",") if name.strip())
            for name in stores:
                try:
                    lexical_store_name(name)
                except ValueError as error:
                    raise CommandError(f"--lexical-store: {error}") from None
        try:
            result = evaluate(
                Path(directory),
                max_queries=max_queries,
                reranker=make_reranker(reranker or settings.CACHET_RERANKER),
                candidates=settings.CACHET_SEARCH_CANDIDATES,
                embedder=get_embedder(embedding_model),
                modes=chosen,
                lexical_stores=stores,
            )
        except (FileNotFoundError, ValueError, ModelSourceError) as error:
            raise CommandError(str(error)) from None
        self.stdout.write(json.dumps(result, indent=2))
