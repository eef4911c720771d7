from django.apps import AppConfig


class RetrievalConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "retrieval"
    verbose_name = "Retrieval"

    def ready(self) -> None:
        # NOTE: a worker checks the index against the database when it starts, before any task.
        from celery.signals import worker_ready

        from retrieval import signals  # noqa: F401 - connects the receivers

        worker_ready.connect(_repair_on_worker_start, weak=False)


def _repair_on_worker_start(**kwargs) -> None:
    from retrieval.search import get_retriever

    get_retriever()  # builds the retriever, which repairs the index
