"""Fixtures of the API tests."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.test import Client

from api import rate_limits
from tests.api.key_clients import client_for


@pytest.fixture
def user():
    """A user without keys or rights."""
    return get_user_model().objects.create_user("ada", password="pw-ada-1234567")


@pytest.fixture
def fresh_limits():
    """The module's per-process rate limiter without counters from earlier tests."""
    rate_limits.reset()


@pytest.fixture
def staff() -> Client:
    """A client with a staff user's key."""
    return client_for(get_user_model().objects.create_user("staff", is_staff=True))


@pytest.fixture
def member() -> tuple[User, Client]:
    """A user without staff rights, and a client with their key."""
    user = get_user_model().objects.create_user("member")
    return user, client_for(user)
