"""API keys for the OpenAI-compatible REST API.

A key is shown once, when it is made (`ApiKey.create_for`, or the admin's add form); only its
SHA-256 hash and its first characters (the prefix, to tell keys apart in lists) are stored. A key
acts as its user, may be revoked, and carries its own per-minute limits and usage counters.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

KEY_PREFIX = "ck-"
# The part of a key kept in clear: "ck-" and 9 random characters (54 bits), enough to tell keys
# apart in the admin, far too little to guess the rest.
PREFIX_LENGTH = 12
# 32 random bytes = 256 bits, 43 URL-safe characters.
KEY_BYTES = 32


def generate_key() -> str:
    """A new random key: `ck-` followed by 43 URL-safe characters."""
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def hash_key(raw: str) -> str:
    """The SHA-256 hex digest of a key, as stored in `ApiKey.key_hash`.

    NOTE: a fast unsalted hash is right here, unlike for passwords: generated keys are 256-bit
    random tokens (and the bootstrap key must be at least 32 characters), so there is nothing to
    brute-force, and an unsalted hash lets a request find its key with one indexed lookup.
    """
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def _limit_field(verbose_name: str, setting: str) -> models.PositiveIntegerField:
    return models.PositiveIntegerField(
        verbose_name,
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=format_lazy(_("Empty: the {setting} setting."), setting=setting),
    )


class ApiKey(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="api_keys",
        verbose_name=_("user"),
        help_text=_("The key acts as this user (documents it may read or, if staff, manage)."),
    )
    name = models.CharField(
        _("name"), max_length=100, help_text=_("What the key is for, e.g. 'CI pipeline'.")
    )
    prefix = models.CharField(_("prefix"), max_length=PREFIX_LENGTH, db_index=True, editable=False)
    key_hash = models.CharField(_("key hash"), max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(_("revoked at"), null=True, blank=True, editable=False)
    requests_per_minute = _limit_field(_("requests per minute"), "CACHET_API_REQUESTS_PER_MINUTE")
    tokens_per_minute = _limit_field(_("tokens per minute"), "CACHET_API_TOKENS_PER_MINUTE")
    # Usage since the key was made; only ever changed with F() updates (see api.keys.record_usage).
    num_requests = models.PositiveBigIntegerField(_("requests"), default=0, editable=False)
    num_prompt_tokens = models.PositiveBigIntegerField(
        _("prompt tokens"), default=0, editable=False
    )
    num_completion_tokens = models.PositiveBigIntegerField(
        _("completion tokens"), default=0, editable=False
    )

    class Meta:
        verbose_name = _("API key")
        verbose_name_plural = _("API keys")
        ordering = ["-created_at", "-id"]
        constraints = [
            # NOTE: the validators guard forms and full_clean(); these guard every other write.
            models.CheckConstraint(
                condition=models.Q(requests_per_minute__isnull=True)
                | models.Q(requests_per_minute__gte=1),
                name="api_key_requests_per_minute_at_least_1",
            ),
            models.CheckConstraint(
                condition=models.Q(tokens_per_minute__isnull=True)
                | models.Q(tokens_per_minute__gte=1),
                name="api_key_tokens_per_minute_at_least_1",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def create_for(
        cls,
        user,
        name: str,
        *,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
    ) -> tuple[ApiKey, str]:
        """Make a key for `user`; returns it and its plaintext, which is not stored anywhere.

        Raises `ValidationError` for a bad name or a limit under 1.
        """
        api_key = cls(
            user=user,
            name=name,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
        )
        raw = api_key.set_new_key()
        api_key.full_clean()
        api_key.save()
        return api_key, raw

    def set_new_key(self) -> str:
        """Give this (unsaved) key a fresh random value; returns the plaintext."""
        raw = generate_key()
        self.set_key(raw)
        return raw

    def set_key(self, raw: str) -> None:
        self.prefix = raw[:PREFIX_LENGTH]
        self.key_hash = hash_key(raw)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])

    @property
    def effective_requests_per_minute(self) -> int:
        return self.requests_per_minute or settings.CACHET_API_REQUESTS_PER_MINUTE

    @property
    def effective_tokens_per_minute(self) -> int:
        return self.tokens_per_minute or settings.CACHET_API_TOKENS_PER_MINUTE
