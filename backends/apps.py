from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class BackendsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "backends"
    verbose_name = _("Inference backends")
