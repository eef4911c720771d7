from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class InferenceConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "inference"
    verbose_name = _("Inference")

    def ready(self) -> None:
        from django.conf import settings

        if settings.CACHET_TORCH_THREADS:
            import torch

            # NOTE: torch threads are a per-thread setting: this covers the main thread; the
            # engine thread applies EngineConfig.num_threads itself (inference/engine_settings.py).
            torch.set_num_threads(settings.CACHET_TORCH_THREADS)
