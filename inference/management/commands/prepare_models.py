"""`manage.py prepare_models`: convert and verify the configured chat and embedding models."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.model_files import ModelSourceError
from inference.provisioning import prepare_models


class Command(BaseCommand):
    help = "Find, convert (once) and load-check the chat and embedding models."

    def handle(self, *args, **options) -> None:
        try:
            prepared = prepare_models(
                settings.CACHET_MODEL, settings.CACHET_EMBEDDING_MODEL, settings.MODELS_DIR
            )
        except ModelSourceError as error:
            raise CommandError(str(error)) from None
        for model in prepared:
            self.stdout.write(model.describe())
