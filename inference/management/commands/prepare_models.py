"""`manage.py prepare_models`: fetch, convert and verify the chat and embedding models.

`--model NAME` (repeatable) prepares the named models instead of CACHET_MODEL; `--list` prints
the model catalogue.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from chatsite.env import ConfigError, read_model_source
from inference import catalogue
from inference.model_files import ModelSourceError
from inference.provisioning import prepare_models

LIST_COLUMNS = ("name", "params", "format", "size", "kind", "fetched", "")


class Command(BaseCommand):
    help = "Fetch (once), convert (once) and load-check the chat and embedding models."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--model",
            action="append",
            dest="models",
            metavar="NAME",
            help="a catalogue model (see --list), hub id, directory or .gguf file to prepare "
            "instead of CACHET_MODEL; repeat it for several",
        )
        parser.add_argument(
            "--list", action="store_true", help="print the model catalogue and exit"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            self.stdout.write(catalogue_table())
            return
        try:
            chat_sources = [
                read_model_source(
                    {"--model": name},
                    "--model",
                    default=settings.CACHET_MODEL,
                    catalogue=catalogue.CATALOGUE,
                )
                for name in options["models"] or [settings.CACHET_MODEL]
            ]
            prepared = prepare_models(
                chat_sources,
                settings.CACHET_EMBEDDING_MODEL,
                settings.MODELS_DIR,
                model_cache=settings.CACHET_MODEL_CACHE,
            )
        except (ConfigError, ModelSourceError) as error:
            raise CommandError(str(error)) from None
        for model in prepared:
            self.stdout.write(model.describe())


def catalogue_table() -> str:
    """The catalogue as a plain-text table, with what is fetched, the default and CACHET_MODEL."""
    rows = [LIST_COLUMNS]
    for model in catalogue.CATALOGUE.values():
        is_fetched = catalogue.fetched_path(model.name, settings.CACHET_MODEL_CACHE) is not None
        if isinstance(model.origin, catalogue.PackagedFile):
            fetched = "installed" if is_fetched else "not installed"
        else:
            fetched = "yes" if is_fetched else "no"
        uses = [
            *(["default"] if model.name == catalogue.DEFAULT_CHAT_MODEL else []),
            *(["CACHET_MODEL"] if model.name == settings.CACHET_MODEL else []),
        ]
        rows.append(
            (
                model.name,
                model.parameters,
                model.format,
                f"{model.size_mb:,.0f} MB",
                model.kind,
                fetched,
                ", ".join(uses),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(LIST_COLUMNS))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(
        [*lines, "", f"models cache: {settings.CACHET_MODEL_CACHE} (CACHET_MODEL_CACHE)"]
    )
