"""The API-key admin: a new key is shown once and stored as a hash; limits, usage, revocation."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from api.keys import ApiKeyError, authenticate, hash_key, record_usage
from api.models import ApiKey

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/api/apikey/"
ADD_URL = "/admin/api/apikey/add/"
KEY = re.compile(r"ck-[A-Za-z0-9_-]{43}")


@pytest.fixture
def staff_client(client):
    get_user_model().objects.create_superuser("root", password="pw-root-123456")
    client.login(username="root", password="pw-root-123456")
    return client


@pytest.fixture
def owner():
    return get_user_model().objects.create_user("robot", password="pw-robot-123456")


def add_key(staff_client, owner, **fields):
    form = {"user": owner.pk, "name": "ci", "requests_per_minute": "", "tokens_per_minute": ""}
    return staff_client.post(ADD_URL, form | fields, follow=True)


def test_non_staff_users_cannot_open_the_key_admin(client, owner) -> None:
    client.login(username="robot", password="pw-robot-123456")
    assert client.get(ADD_URL).status_code == 302  # to the admin login


def test_the_add_form_asks_only_for_user_name_and_limits(staff_client) -> None:
    page = staff_client.get(ADD_URL).content.decode()
    fields = set(re.findall(r'name="([a-z_]+)"', page)) - {"csrfmiddlewaretoken", "_save"}
    assert {"user", "name", "requests_per_minute", "tokens_per_minute"} <= fields
    assert not fields & {"key_hash", "prefix", "revoked_at", "num_requests", "last_used_at"}


def test_a_new_key_is_shown_once_and_only_its_hash_is_stored(staff_client, owner) -> None:
    response = add_key(staff_client, owner, requests_per_minute="30")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Copy this key now, it will not be shown again:" in page
    shown = KEY.findall(page)
    assert len(set(shown)) == 1
    raw = shown[0]
    api_key = ApiKey.objects.get()
    assert (api_key.user, api_key.name, api_key.requests_per_minute) == (owner, "ci", 30)
    assert api_key.tokens_per_minute is None
    assert api_key.key_hash == hash_key(raw)
    assert api_key.prefix == raw[:12]
    assert all(raw not in str(value) for value in ApiKey.objects.values().get().values())
    assert authenticate(f"Bearer {raw}") == api_key
    # Never again: not in the list, not on the key's page.
    for url in (CHANGELIST, f"{CHANGELIST}{api_key.pk}/change/"):
        later = staff_client.get(url).content.decode()
        assert raw not in later
        assert api_key.key_hash not in later
        assert raw[:12] in later


def test_a_zero_limit_is_refused_by_the_form(staff_client, owner) -> None:
    response = add_key(staff_client, owner, tokens_per_minute="0")
    assert "Ensure this value is greater than or equal to 1." in response.content.decode()
    assert not ApiKey.objects.exists()


def test_editing_a_key_changes_its_limits_but_not_its_value_or_owner(staff_client, owner) -> None:
    api_key, raw = ApiKey.create_for(owner, "ci")
    other = get_user_model().objects.create_user("eve", password="pw-eve-12345678")
    response = staff_client.post(
        f"{CHANGELIST}{api_key.pk}/change/",
        {
            "user": other.pk,
            "name": "ci (renamed)",
            "requests_per_minute": "5",
            "tokens_per_minute": "",
        },
        follow=True,
    )
    assert response.status_code == 200
    assert "not be shown again" not in response.content.decode()
    api_key.refresh_from_db()
    assert (api_key.name, api_key.requests_per_minute, api_key.user) == ("ci (renamed)", 5, owner)
    assert api_key.key_hash == hash_key(raw)


def test_the_list_shows_prefix_limits_and_usage_and_finds_keys(staff_client, owner, settings):
    settings.CACHET_API_TOKENS_PER_MINUTE = 4321
    api_key, _ = ApiKey.create_for(owner, "nightly-export", requests_per_minute=17)
    ApiKey.create_for(owner, "something-else")
    record_usage(api_key, prompt_tokens=1234, completion_tokens=567)
    page = staff_client.get(CHANGELIST, {"q": api_key.prefix}).content.decode()
    assert "nightly-export" in page and "something-else" not in page
    cells = dict(re.findall(r'<td class="field-([a-z_]+)[^"]*">(.*?)</td>', page))
    assert cells["prefix_display"] == f"{api_key.prefix}…"
    assert cells["user"] == "robot"
    assert 'alt="True"' in cells["is_active"]
    assert cells["requests_per_minute_display"] == "17"
    assert cells["tokens_per_minute_display"] == "4321 (default)"
    assert (cells["num_requests"], cells["num_prompt_tokens"], cells["num_completion_tokens"]) == (
        "1",
        "1234",
        "567",
    )
    assert "nightly-export" in staff_client.get(CHANGELIST, {"q": "robot"}).content.decode()
    assert "nightly-export" in staff_client.get(CHANGELIST, {"q": "nightly"}).content.decode()


def test_the_revoke_action_revokes_the_selected_keys_only(staff_client, owner) -> None:
    first, first_raw = ApiKey.create_for(owner, "first")
    second, _ = ApiKey.create_for(owner, "second")
    kept, kept_raw = ApiKey.create_for(owner, "kept")
    response = staff_client.post(
        CHANGELIST,
        {"action": "revoke_selected", "_selected_action": [first.pk, second.pk]},
        follow=True,
    )
    assert "Revoked 2 keys." in response.content.decode()
    first.refresh_from_db()
    kept.refresh_from_db()
    assert not first.is_active and kept.is_active
    with pytest.raises(ApiKeyError):
        authenticate(f"Bearer {first_raw}")
    assert authenticate(f"Bearer {kept_raw}") == kept
    # Revoking again keeps the first revocation time.
    revoked_at = first.revoked_at
    staff_client.post(CHANGELIST, {"action": "revoke_selected", "_selected_action": [first.pk]})
    first.refresh_from_db()
    assert first.revoked_at == revoked_at
