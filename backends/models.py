"""InferenceBackend: a remote OpenAI-compatible endpoint (a vLLM server, another Cachet).

The in-process engine is the default backend and needs no row. Rows serving the same `model` are
replicas of one pool: a request goes to one of them, chosen by `weight`, and fails over to the
next when one cannot take it (backends.replicas). `health` is what the last check or request saw.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class InferenceBackend(models.Model):
    class Health(models.TextChoices):
        UNKNOWN = "unknown", _("Unknown")
        UP = "up", _("Up")
        DOWN = "down", _("Down")

    name = models.SlugField(
        _("name"),
        max_length=64,
        unique=True,
        help_text=_("Recorded with each answer and in the metrics."),
    )
    base_url = models.URLField(
        _("base URL"),
        max_length=500,
        help_text=_(
            "The OpenAI-compatible API root, e.g. http://gpu-1:8000/v1 (chat completions are "
            "POSTed to <base_url>/chat/completions)."
        ),
    )
    # NOTE: a secret the server must send, so it cannot be hashed; it is kept out of list pages,
    # __str__/__repr__ and logs, and the admin form never shows it back.
    api_key = models.CharField(_("API key"), max_length=500, blank=True)
    model = models.CharField(
        _("model"),
        max_length=300,
        help_text=_(
            "The model name sent to the endpoint; also the name clients choose it by. Backends "
            "with the same model are replicas of one pool."
        ),
    )
    weight = models.PositiveIntegerField(
        _("weight"),
        default=1,
        validators=[MinValueValidator(1)],
        help_text=_("Share of the pool's requests this replica gets (relative to the others)."),
    )
    is_enabled = models.BooleanField(_("is enabled"), default=True)
    takes_complex_requests = models.BooleanField(
        _("takes complex requests"),
        default=True,
        help_text=_(
            "Routing sends complex requests (long prompts, many passages) to this model (see the "
            "README's routing rules)."
        ),
    )
    health = models.CharField(
        _("health"), max_length=8, choices=Health.choices, default=Health.UNKNOWN
    )
    health_detail = models.CharField(_("health detail"), max_length=500, blank=True)
    health_checked_at = models.DateTimeField(_("health checked at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ["model", "name"]
        verbose_name = _("inference backend")
        verbose_name_plural = _("inference backends")

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<InferenceBackend {self.name} {self.model} at {self.base_url}>"

    @property
    def chat_completions_url(self) -> str:
        return f"{self.base_url.rstrip('/')}/chat/completions"

    @property
    def models_url(self) -> str:
        return f"{self.base_url.rstrip('/')}/models"

    def is_due_for_retry(self, now=None) -> bool:
        """A replica marked down is tried again once CACHET_BACKEND_RETRY_S have passed."""
        if self.health != self.Health.DOWN or self.health_checked_at is None:
            return True
        now = now or timezone.now()
        return now - self.health_checked_at >= timedelta(seconds=settings.CACHET_BACKEND_RETRY_S)
