"""api.keys: authenticating by Authorization header, usage counting, and the bootstrap key."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from api.keys import (
    ApiKeyError,
    aauthenticate,
    arecord_usage,
    authenticate,
    ensure_bootstrap_key,
    hash_key,
    record_usage,
)
from api.models import ApiKey
from chatsite.env import ConfigError

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP_KEY = "ck-bootstrap-for-tests-0123456789abcdefghij"


@pytest.fixture
def key(user) -> tuple[ApiKey, str]:
    return ApiKey.create_for(user, "laptop")


def refusal(header: str | None) -> ApiKeyError:
    with pytest.raises(ApiKeyError) as error:
        authenticate(header)
    return error.value


def test_the_hash_at_rest_is_not_the_key(key) -> None:
    api_key, raw = key
    row = ApiKey.objects.filter(pk=api_key.pk).values().get()
    assert all(raw not in str(value) for value in row.values())
    assert row["key_hash"] == hash_key(raw) != raw


def test_a_valid_bearer_key_authenticates_as_its_user_in_one_query(
    key, user, django_assert_num_queries
) -> None:
    api_key, raw = key
    authenticate(f"Bearer {raw}")  # the first use also records last_used_at
    with django_assert_num_queries(1):
        found = authenticate(f"Bearer {raw}")
        assert found.user.username == "ada"  # loaded with the key, no second query
    assert found == api_key


def test_the_bearer_scheme_is_case_insensitive_and_spacing_is_forgiven(key) -> None:
    api_key, raw = key
    assert authenticate(f"bearer {raw}") == api_key
    assert authenticate(f"  BEARER   {raw}  ") == api_key


@pytest.mark.parametrize("header", [None, "", "   "])
def test_a_missing_key_is_refused_with_openais_message(header) -> None:
    error = refusal(header)
    assert "You didn't provide an API key" in error.message
    assert error.code is None


@pytest.mark.parametrize(
    "header",
    ["ck-abcdefghijklmnopqrstuvwxyz", "Basic dXNlcjpwYXNz", "Bearer", "Bearer one two", "Token x"],
)
def test_a_malformed_authorization_header_is_refused(header) -> None:
    error = refusal(header)
    assert "Bearer" in error.message
    assert error.code == "invalid_api_key"


def test_an_unknown_key_is_refused_showing_only_a_masked_form(key) -> None:
    _, raw = key
    wrong = raw[:-1] + ("A" if raw[-1] != "A" else "B")
    error = refusal(f"Bearer {wrong}")
    assert error.message.startswith(f"Incorrect API key provided: {wrong[:6]}…{wrong[-3:]}.")
    assert wrong not in error.message
    assert wrong[6:-3] not in error.message
    assert error.code == "invalid_api_key"


def test_a_short_unknown_key_is_not_echoed_at_all() -> None:
    error = refusal("Bearer hunter2")
    assert "hunter" not in error.message
    assert "Incorrect API key provided: …." in error.message


def test_a_revoked_key_is_refused_with_a_masked_message(key) -> None:
    api_key, raw = key
    api_key.revoke()
    error = refusal(f"Bearer {raw}")
    assert "revoked" in error.message
    assert f"{raw[:6]}…{raw[-3:]}" in error.message
    assert raw not in error.message


def test_a_key_of_a_deactivated_user_is_refused(key, user) -> None:
    _, raw = key
    user.is_active = False
    user.save()
    error = refusal(f"Bearer {raw}")
    assert "deactivated" in error.message
    assert raw not in error.message


def test_last_used_is_written_at_most_once_a_minute(key) -> None:
    api_key, raw = key
    assert api_key.last_used_at is None
    authenticate(f"Bearer {raw}")
    first = ApiKey.objects.get(pk=api_key.pk).last_used_at
    assert first is not None
    authenticate(f"Bearer {raw}")
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at == first
    two_minutes_ago = timezone.now() - timedelta(minutes=2)
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=two_minutes_ago)
    authenticate(f"Bearer {raw}")
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at > first


def test_usage_is_counted_per_key_in_one_update(key, user, django_assert_num_queries) -> None:
    api_key, _ = key
    other, _ = ApiKey.create_for(user, "other")
    with django_assert_num_queries(1):
        record_usage(api_key, prompt_tokens=12, completion_tokens=30)
    record_usage(api_key, prompt_tokens=8, completion_tokens=0)
    record_usage(api_key)
    api_key.refresh_from_db()
    other.refresh_from_db()
    assert (api_key.num_requests, api_key.num_prompt_tokens, api_key.num_completion_tokens) == (
        3,
        20,
        30,
    )
    assert (other.num_requests, other.num_prompt_tokens, other.num_completion_tokens) == (0, 0, 0)


def test_negative_token_counts_are_a_programming_error(key) -> None:
    with pytest.raises(ValueError):
        record_usage(key[0], prompt_tokens=-1)


@pytest.mark.django_db(transaction=True)
def test_usage_counted_from_many_threads_loses_nothing(user) -> None:
    api_key, _ = ApiKey.create_for(user, "busy")
    errors: list[BaseException] = []

    def work() -> None:
        from django.db import connection

        try:
            for _ in range(10):
                record_usage(api_key, prompt_tokens=2, completion_tokens=3)
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    api_key.refresh_from_db()
    assert (api_key.num_requests, api_key.num_prompt_tokens, api_key.num_completion_tokens) == (
        60,
        120,
        180,
    )


@pytest.mark.django_db(transaction=True)
async def test_the_async_wrappers_authenticate_and_count(user) -> None:
    api_key, raw = await sync_to_async(ApiKey.create_for)(user, "async")
    found = await aauthenticate(f"Bearer {raw}")
    assert found.pk == api_key.pk and found.user.username == "ada"
    await arecord_usage(found, 5, 6)
    await api_key.arefresh_from_db()
    assert (api_key.num_requests, api_key.num_prompt_tokens) == (1, 5)
    with pytest.raises(ApiKeyError):
        await aauthenticate("Bearer nope-nope-nope-nope-nope")


def test_no_bootstrap_key_is_made_when_the_setting_is_unset(settings) -> None:
    settings.CACHET_BOOTSTRAP_API_KEY = None
    assert ensure_bootstrap_key() is None
    assert not ApiKey.objects.exists()
    assert not get_user_model().objects.exists()


def test_the_bootstrap_key_is_created_once_for_a_new_staff_user(settings) -> None:
    settings.CACHET_BOOTSTRAP_API_KEY = BOOTSTRAP_KEY
    api_key, created = ensure_bootstrap_key()
    again, created_again = ensure_bootstrap_key()
    assert (created, created_again) == (True, False)
    assert again.pk == api_key.pk
    assert ApiKey.objects.count() == 1
    owner = get_user_model().objects.get()
    assert owner.username == "api"
    assert owner.is_staff and owner.is_active and not owner.is_superuser
    assert not owner.has_usable_password()
    assert api_key.prefix == BOOTSTRAP_KEY[:12]
    assert authenticate(f"Bearer {BOOTSTRAP_KEY}").user == owner


def test_the_bootstrap_key_belongs_to_the_configured_existing_user(settings, user) -> None:
    settings.CACHET_BOOTSTRAP_API_KEY = BOOTSTRAP_KEY
    settings.CACHET_BOOTSTRAP_API_USER = "ada"
    api_key, _ = ensure_bootstrap_key()
    assert api_key.user == user
    user.refresh_from_db()
    assert not user.is_staff and user.has_usable_password()  # an existing user is left as it is
    assert get_user_model().objects.count() == 1


def test_the_bootstrap_key_follows_a_change_of_its_configured_user(settings, user) -> None:
    settings.CACHET_BOOTSTRAP_API_KEY = BOOTSTRAP_KEY
    first, _ = ensure_bootstrap_key()
    settings.CACHET_BOOTSTRAP_API_USER = "ada"
    again, created = ensure_bootstrap_key()
    assert not created and again.pk == first.pk
    assert authenticate(f"Bearer {BOOTSTRAP_KEY}").user == user


def test_a_revoked_bootstrap_key_stays_revoked_after_a_restart(settings) -> None:
    settings.CACHET_BOOTSTRAP_API_KEY = BOOTSTRAP_KEY
    api_key, _ = ensure_bootstrap_key()
    api_key.revoke()
    again, created = ensure_bootstrap_key()
    assert not created and not again.is_active
    with pytest.raises(ApiKeyError):
        authenticate(f"Bearer {BOOTSTRAP_KEY}")


@pytest.mark.parametrize("value", ["too-short-0123456789", "ck-has a space-0123456789abcdefghijkl"])
def test_a_weak_or_unusable_bootstrap_key_is_refused(settings, value) -> None:
    settings.CACHET_BOOTSTRAP_API_KEY = value
    with pytest.raises(ConfigError) as error:
        ensure_bootstrap_key()
    assert error.value.variable == "CACHET_BOOTSTRAP_API_KEY"
    assert value not in str(error.value)
    with pytest.raises(CommandError):
        call_command("ensure_api_key")
    assert not ApiKey.objects.exists()


def test_the_command_prints_nothing_without_a_bootstrap_key(settings, capsys) -> None:
    settings.CACHET_BOOTSTRAP_API_KEY = None
    call_command("ensure_api_key")
    assert capsys.readouterr().out == ""


def test_the_command_makes_the_key_and_names_only_its_prefix(settings, capsys) -> None:
    settings.CACHET_BOOTSTRAP_API_KEY = BOOTSTRAP_KEY
    call_command("ensure_api_key")
    call_command("ensure_api_key")
    out = capsys.readouterr().out
    assert f"Created API key {BOOTSTRAP_KEY[:12]}… for user 'api'." in out
    assert f"Kept API key {BOOTSTRAP_KEY[:12]}…" in out
    assert BOOTSTRAP_KEY not in out
    assert ApiKey.objects.count() == 1


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("short-key-0123456789", "must be at least 32 characters"),
        ("a " * 20, "must not contain spaces"),
    ],
)
def test_a_bad_bootstrap_key_in_the_environment_stops_start_up(value, problem) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CACHET_")}
    environment |= {
        "DJANGO_SETTINGS_MODULE": "chatsite.settings",
        "CACHET_SECRET_KEY": "a-perfectly-good-secret-key-for-these-tests-only",
        "CACHET_BOOTSTRAP_API_KEY": value,
    }
    result = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; settings.DEBUG"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert f"Bad setting CACHET_BOOTSTRAP_API_KEY: {problem}" in result.stderr
    assert value.strip() not in result.stderr
