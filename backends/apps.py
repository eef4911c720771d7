from django.apps import AppConfig


class BackendsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "backends"
    verbose_name = "Inference backends"
