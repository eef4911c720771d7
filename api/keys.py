"""Authenticating API requests by key, counting their usage, and the bootstrap key.

`authenticate` turns an `Authorization` header into an active `ApiKey` (with its user loaded) or
raises `ApiKeyError` with an OpenAI-style message that never repeats the key in full.
"""

from __future__ import annotations

import hmac
import logging
from datetime import timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.db.models import F, Q
from django.utils import timezone

from api.models import ApiKey, hash_key
from chatsite.env import MIN_SECRET_KEY_LENGTH, ConfigError

__all__ = [
    "ApiKeyError",
    "aauthenticate",
    "arecord_usage",
    "authenticate",
    "ensure_bootstrap_key",
    "hash_key",
    "mask_key",
    "record_usage",
]

log = logging.getLogger(__name__)

# `last_used_at` is written at most this often per key, not on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)
BOOTSTRAP_KEY_NAME = "bootstrap (CACHET_BOOTSTRAP_API_KEY)"

NO_KEY_MESSAGE = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
MALFORMED_MESSAGE = (
    "Malformed Authorization header. Expected 'Authorization: Bearer YOUR_KEY' "
    "with the key as one word."
)


class ApiKeyError(Exception):
    """The request has no usable API key; the API answers 401 with `message`.

    `code` is OpenAI's error code: None for a missing key, "invalid_api_key" otherwise.
    """

    def __init__(self, message: str, code: str | None = "invalid_api_key") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def mask_key(raw: str) -> str:
    """A key shortened for messages and logs: `ck-abc…xyz`; a short value shows even less."""
    if len(raw) >= 20:
        return f"{raw[:6]}…{raw[-3:]}"
    if len(raw) >= 12:
        return f"{raw[:3]}…"
    return "…"


def _key_from_header(authorization_header: str | None) -> str:
    if authorization_header is None or not authorization_header.strip():
        raise ApiKeyError(NO_KEY_MESSAGE, code=None)
    parts = authorization_header.split()
    # NOTE: auth schemes are case-insensitive (RFC 9110 section 11.1).
    if len(parts) != 2 or parts[0].lower() != "bearer":
        raise ApiKeyError(MALFORMED_MESSAGE)
    return parts[1]


def authenticate(authorization_header: str | None) -> ApiKey:
    """The active key named by an `Authorization: Bearer <key>` header, with `.user` loaded.

    Raises `ApiKeyError` for a missing or malformed header, an unknown or revoked key, or a key
    whose user is deactivated. Marks the key as used (at most one write a minute).
    """
    raw = _key_from_header(authorization_header)
    digest = hash_key(raw)
    api_key = ApiKey.objects.select_related("user").filter(key_hash=digest).first()
    # NOTE: the lookup by hash leaks nothing useful through timing (a caller cannot choose the
    # bytes of a SHA-256 digest); the constant-time comparison is defence in depth should the
    # database ever compare differently from Python (collation, padding).
    if api_key is None or not hmac.compare_digest(api_key.key_hash, digest):
        raise ApiKeyError(
            f"Incorrect API key provided: {mask_key(raw)}. "
            "You can find your API keys in the Cachet admin."
        )
    if not api_key.is_active:
        raise ApiKeyError(f"This API key has been revoked: {mask_key(raw)}.")
    if not api_key.user.is_active:
        raise ApiKeyError(f"The user of this API key is deactivated: {mask_key(raw)}.")
    _touch(api_key)
    return api_key


def _touch(api_key: ApiKey) -> None:
    now = timezone.now()
    stale = now - LAST_USED_RESOLUTION
    if api_key.last_used_at is not None and api_key.last_used_at > stale:
        return
    # NOTE: conditional, so concurrent requests (or processes) write the row once, not each.
    ApiKey.objects.filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lte=stale), pk=api_key.pk
    ).update(last_used_at=now)
    api_key.last_used_at = now


def record_usage(
    api_key: ApiKey, prompt_tokens: int = 0, completion_tokens: int = 0, *, num_requests: int = 1
) -> None:
    """Count requests and tokens for `api_key` (one atomic UPDATE; safe concurrently).

    The API counts each HTTP request once when it is authenticated, and its tokens (with
    `num_requests=0`) when the answer is done.
    """
    if min(prompt_tokens, completion_tokens, num_requests) < 0:
        raise ValueError(
            f"counts must not be negative; got {prompt_tokens}, {completion_tokens}, {num_requests}"
        )
    ApiKey.objects.filter(pk=api_key.pk).update(
        num_requests=F("num_requests") + num_requests,
        num_prompt_tokens=F("num_prompt_tokens") + prompt_tokens,
        num_completion_tokens=F("num_completion_tokens") + completion_tokens,
    )


def ensure_bootstrap_key() -> tuple[ApiKey, bool] | None:
    """Make sure the key in `CACHET_BOOTSTRAP_API_KEY` exists; None when the setting is unset.

    Returns the key and whether it was created now. Its owner is the user named by
    `CACHET_BOOTSTRAP_API_USER`, created when missing as an active staff user (so the key may
    manage documents) without a usable password. Idempotent. A key revoked in the admin stays
    revoked (a restart must not undo a revocation): a warning is logged and it is returned as is.
    Raises `ConfigError` for a value too short to be a secret, or with spaces.
    """
    raw = settings.CACHET_BOOTSTRAP_API_KEY
    if not raw:
        return None
    if len(raw) < MIN_SECRET_KEY_LENGTH:
        raise ConfigError(
            "CACHET_BOOTSTRAP_API_KEY",
            f"must be at least {MIN_SECRET_KEY_LENGTH} characters (use a long random string); "
            f"got {len(raw)}",
        )
    if len(raw.split()) != 1:
        raise ConfigError("CACHET_BOOTSTRAP_API_KEY", "must be one word, without spaces")
    username = settings.CACHET_BOOTSTRAP_API_USER or "api"
    user_model = get_user_model()
    # NOTE: make_password(None) is an unusable password: the user can only act through keys.
    user, user_created = user_model.objects.get_or_create(
        **{user_model.USERNAME_FIELD: username},
        defaults={"is_staff": True, "is_active": True, "password": make_password(None)},
    )
    if user_created:
        log.info("created the user %r for the bootstrap API key", username)
    probe = ApiKey(user=user, name=BOOTSTRAP_KEY_NAME)
    probe.set_key(raw)
    api_key, created = ApiKey.objects.get_or_create(
        key_hash=probe.key_hash,
        defaults={"user": user, "name": BOOTSTRAP_KEY_NAME, "prefix": probe.prefix},
    )
    if not created and api_key.user_id != user.pk:
        log.info("the bootstrap API key %s now belongs to %r", api_key.prefix, username)
        api_key.user = user
        api_key.save(update_fields=["user"])
    if not api_key.is_active:
        log.warning(
            "the bootstrap API key %s was revoked in the admin and stays revoked; "
            "set a new CACHET_BOOTSTRAP_API_KEY (or unset it)",
            api_key.prefix,
        )
    return api_key, created


# For async views. Database work runs in Django's thread-sensitive executor.
aauthenticate = sync_to_async(authenticate)
arecord_usage = sync_to_async(record_usage)
