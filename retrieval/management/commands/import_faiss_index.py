"""`manage.py import_faiss_index`: copy the faiss file's vectors into PostgreSQL (pgvector)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from retrieval.collection_indexes import update_collection_indexes
from retrieval.embeddings import get_embedder
from retrieval.faiss_import import import_faiss_index
from retrieval.search import index_path
from retrieval.vector_store import UnreadableIndexError
from retrieval.vector_store_choice import choose_vector_store, make_vector_store


class Command(BaseCommand):
    help = (
        "Copy the vectors of an existing faiss index into PostgreSQL's pgvector column, so that "
        "moving to pgvector re-embeds nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--path",
            type=Path,
            default=None,
            help="the faiss index file (default: $CACHET_DATA_DIR/index/chunks.faiss)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["path"] or index_path()
        try:
            choice = choose_vector_store(
                "pgvector"
                if settings.CACHET_VECTOR_STORE == "auto"
                else settings.CACHET_VECTOR_STORE
            )
        except ValueError as error:
            raise CommandError(str(error)) from None
        if choice.name != "pgvector":
            raise CommandError(
                f"CACHET_VECTOR_STORE={settings.CACHET_VECTOR_STORE}: nothing to import into"
            )
        embedder = get_embedder()
        store = make_vector_store(choice, embedder.dimension, embedder.model_id, path)
        try:
            report = import_faiss_index(path, store)
        except UnreadableIndexError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(
            f"imported {report.imported} vectors of {embedder.model_id} from {path}; "
            f"{report.without_chunk} left out (their chunks are gone or not ready); "
            f"{report.still_missing} ready chunks still without a vector (the next start "
            "embeds them)"
        )
        # NOTE: imported vectors skip ingestion's check, so large collections get theirs here
        built = update_collection_indexes(wait=True)
        if built is not None and built.built:
            self.stdout.write(f"collections given an HNSW index of their own: {built.built}")
