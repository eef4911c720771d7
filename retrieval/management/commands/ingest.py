"""`manage.py ingest PATH... --collection NAME`: ingest files (or directories) in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.files import File
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from retrieval.extract import SUPPORTED_SUFFIXES
from retrieval.ingest import ingest
from retrieval.models import Collection, Document
from retrieval.search import get_retriever


def files_under(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found.extend(
                p for p in sorted(path.rglob("*")) if p.suffix.lower() in SUPPORTED_SUFFIXES
            )
        elif path.is_file():
            found.append(path)
        else:
            raise CommandError(f"no such file or directory: {path}")
    return found


class Command(BaseCommand):
    help = "Ingest files into a collection (created if missing), with a progress bar."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+")
        parser.add_argument("--collection", required=True)

    def handle(self, *args: Any, paths: list[str], collection: str, **options: Any) -> None:
        target, _ = Collection.objects.get_or_create(name=collection)
        files = files_under(paths)
        retriever = get_retriever()
        failed = 0
        for path in tqdm(files, desc="ingesting", unit="file", disable=options["verbosity"] == 0):
            with path.open("rb") as handle:
                document = Document.objects.create(
                    collection=target, title=path.name, file=File(handle, name=path.name)
                )
            ingest(document.pk, retriever)
            document.refresh_from_db()
            if document.status == Document.Status.FAILED:
                failed += 1
                self.stderr.write(f"{path}: {document.error}")
        self.stdout.write(f"{len(files) - failed} ingested, {failed} failed into {target.name!r}")
