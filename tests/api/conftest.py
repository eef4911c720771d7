"""Fixtures of the API tests."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model


@pytest.fixture
def user():
    """A user without keys or rights."""
    return get_user_model().objects.create_user("ada", password="pw-ada-1234567")
