"""Test clients that authenticate with an API key, as integrations do."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from api.models import ApiKey


def client_for(user: User) -> Client:
    """A test client sending a fresh key of `user`."""
    _, key = ApiKey.create_for(user, "test")
    return Client(headers={"Authorization": f"Bearer {key}"})
