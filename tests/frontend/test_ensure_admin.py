"""`manage.py ensure_admin`: unattended creation of the first staff user."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_nothing_happens_without_a_password(monkeypatch, capsys) -> None:
    monkeypatch.delenv("CACHET_ADMIN_PASSWORD", raising=False)
    call_command("ensure_admin")
    assert get_user_model().objects.count() == 0
    assert "not set" in capsys.readouterr().out


def test_a_superuser_is_created_then_its_password_updated(monkeypatch, client) -> None:
    monkeypatch.setenv("CACHET_ADMIN_PASSWORD", "first-Pass-123")
    call_command("ensure_admin")
    monkeypatch.setenv("CACHET_ADMIN_PASSWORD", "second-Pass-456")
    call_command("ensure_admin")
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_staff and admin.is_superuser
    assert client.login(username="admin", password="second-Pass-456")
    assert client.get("/admin/").status_code == 200


def test_the_username_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("CACHET_ADMIN_PASSWORD", "some-Pass-789")
    monkeypatch.setenv("CACHET_ADMIN_USERNAME", "ops")
    call_command("ensure_admin")
    assert get_user_model().objects.filter(username="ops", is_superuser=True).exists()
