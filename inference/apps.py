from django.apps import AppConfig


class InferenceConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "inference"

    def ready(self) -> None:
        from django.conf import settings

        if settings.CACHET_TORCH_THREADS:
            import torch

            # NOTE: process-wide: the engine and the embedding model share these threads.
            torch.set_num_threads(settings.CACHET_TORCH_THREADS)
