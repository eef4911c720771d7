"""`manage.py backfill_postings`: index the chunks that have no BM25 postings yet (PostgreSQL)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from retrieval import postings


class Command(BaseCommand):
    help = (
        "Write the BM25 postings and statistics of chunks stored before the PostgreSQL lexical "
        "store existed (an upgrade); --rebuild drops and rewrites all of them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--rebuild",
            action="store_true",
            help="drop every posting and statistic and index all chunks again, in one transaction",
        )
        parser.add_argument("--batch-size", type=int, default=2000)

    def handle(self, *args: Any, rebuild: bool, batch_size: int, **options: Any) -> None:
        if not postings.is_maintained():
            raise CommandError(
                "BM25 postings are kept in PostgreSQL only; this database is not PostgreSQL "
                "(SQLite uses the in-process bm25s store, which needs no backfill)."
            )
        if batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1; got {batch_size}")
        count = postings.rebuild() if rebuild else postings.backfill(batch_size)
        num_chunks, total_length = postings.corpus_totals()
        self.stdout.write(
            f"indexed {count} chunks; the index holds {num_chunks} chunks, "
            f"{total_length} terms in all"
        )
