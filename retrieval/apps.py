"""The retrieval app's configuration: signal receivers, and the Celery worker's start-up check."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RetrievalConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "retrieval"
    verbose_name = _("Retrieval")

    def ready(self) -> None:
        # NOTE: a worker checks the index against the database when it starts, before any task,
        # and queues again the ingestions a killed worker left unfinished.
        from celery.signals import worker_ready

        from retrieval import signals  # noqa: F401 - connects the receivers

        worker_ready.connect(_repair_on_worker_start, weak=False)


def _repair_on_worker_start(**kwargs: Any) -> None:
    from retrieval.recovery import recover_interrupted_ingestions
    from retrieval.search import get_retriever

    get_retriever()  # builds the retriever, which repairs the index
    # NOTE: documents a killed worker left `processing` are queued again (retrieval.recovery).
    recover_interrupted_ingestions(include_queued=False)
