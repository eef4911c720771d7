"""`manage.py index_collections`: give every large collection its own HNSW index (pgvector)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from retrieval.collection_indexes import OWN_INDEX_ROWS, update_collection_indexes
from retrieval.search import get_retriever


class Command(BaseCommand):
    help = (
        "Build an HNSW index of its own for every collection of more than --min-rows chunks "
        "and drop those of collections gone or shrunk below half (pgvector only; concurrent "
        "builds: searches and ingestion go on)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("collection_ids", nargs="*", type=int, help="only these (default all)")
        parser.add_argument(
            "--min-rows",
            type=int,
            default=OWN_INDEX_ROWS,
            help="chunks a collection has before it gets an index",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not get_retriever().vectors.in_database:
            raise CommandError("the vector store is faiss: collection indexes are pgvector's")
        if options["min_rows"] < 1:
            raise CommandError("--min-rows must be positive")
        done = update_collection_indexes(
            options["collection_ids"] or None, min_rows=options["min_rows"], wait=True
        )
        assert done is not None  # NOTE: waited for the lock
        self.stdout.write(f"built: {done.built or 'none'}; dropped: {done.dropped or 'none'}")
