"""api.models.ApiKey: made with a random value kept only as a hash, limits, revocation."""

from __future__ import annotations

import hashlib

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from api.models import ApiKey

pytestmark = pytest.mark.django_db


def test_a_new_key_is_a_long_random_token_stored_only_as_its_sha256(user) -> None:
    api_key, raw = ApiKey.create_for(user, "laptop")
    assert raw.startswith("ck-")
    assert len(raw) == 3 + 43  # 32 random bytes, URL-safe base64 without padding
    stored = ApiKey.objects.get(pk=api_key.pk)
    assert stored.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert stored.prefix == raw[:12]
    assert raw not in {
        str(value) for value in ApiKey.objects.filter(pk=api_key.pk).values()[0].values()
    }


def test_every_key_is_different(user) -> None:
    raws = {ApiKey.create_for(user, f"key {n}")[1] for n in range(20)}
    assert len(raws) == 20
    assert ApiKey.objects.values("key_hash").distinct().count() == 20


def test_a_key_names_itself_by_name_and_prefix_never_by_its_value(user) -> None:
    api_key, raw = ApiKey.create_for(user, "laptop")
    assert str(api_key) == f"laptop ({raw[:12]}…)"
    assert raw not in repr(api_key)


def test_keys_belong_to_their_user_and_go_with_them(user) -> None:
    api_key, _ = ApiKey.create_for(user, "laptop")
    assert list(user.api_keys.all()) == [api_key]
    user.delete()
    assert not ApiKey.objects.exists()


def test_a_revoked_key_is_inactive_and_keeps_its_revocation_time(user) -> None:
    api_key, _ = ApiKey.create_for(user, "laptop")
    assert api_key.is_active
    api_key.revoke()
    first = ApiKey.objects.get(pk=api_key.pk).revoked_at
    assert first is not None
    api_key.revoke()
    assert not api_key.is_active
    assert ApiKey.objects.get(pk=api_key.pk).revoked_at == first


def test_empty_limits_mean_the_configured_defaults(user, settings) -> None:
    settings.CACHET_API_REQUESTS_PER_MINUTE = 7
    settings.CACHET_API_TOKENS_PER_MINUTE = 700
    default, _ = ApiKey.create_for(user, "default")
    own, _ = ApiKey.create_for(user, "own", requests_per_minute=3, tokens_per_minute=30)
    assert (default.effective_requests_per_minute, default.effective_tokens_per_minute) == (7, 700)
    assert (own.effective_requests_per_minute, own.effective_tokens_per_minute) == (3, 30)


def test_a_limit_of_zero_is_refused(user) -> None:
    with pytest.raises(ValidationError) as error:
        ApiKey.create_for(user, "zero", requests_per_minute=0)
    assert "requests_per_minute" in error.value.message_dict
    with pytest.raises(ValidationError):
        ApiKey.create_for(user, "zero", tokens_per_minute=0)
    assert not ApiKey.objects.exists()


def test_the_database_refuses_a_zero_limit_written_around_validation(user) -> None:
    api_key, _ = ApiKey.create_for(user, "laptop")
    for field in ("requests_per_minute", "tokens_per_minute"):
        with pytest.raises(IntegrityError), transaction.atomic():
            ApiKey.objects.filter(pk=api_key.pk).update(**{field: 0})


def test_a_key_needs_a_name(user) -> None:
    with pytest.raises(ValidationError):
        ApiKey.create_for(user, "")
