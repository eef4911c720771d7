"""Test clients that authenticate with an API key, as integrations do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
from django.contrib.auth.models import User
from django.test import Client

from api.models import ApiKey
from harness.live_server import LiveServer

# Run in a live server's shell: one key of a plain user, printed.
ONE_KEY_SETUP = """
from django.contrib.auth.models import User
from api.models import ApiKey
_, key = ApiKey.create_for(User.objects.create_user("integrator"), "ci")
print(key)
"""


def client_for(user: User) -> Client:
    """A test client sending a fresh key of `user`."""
    _, key = ApiKey.create_for(user, "test")
    return Client(headers={"Authorization": f"Bearer {key}"})


@contextmanager
def live_server_with_a_key(models_dir: Path, env: dict | None = None) -> Iterator[LiveServer]:
    """A started live server on `models_dir`'s model; its user's key is `server.key`."""
    with LiveServer(models_dir=models_dir, env=env) as live:
        live.key = live.shell(ONE_KEY_SETUP).strip()
        live.start()
        yield live


def openai_client(server: LiveServer) -> openai.OpenAI:
    """The official client on the server's /v1 with its key, no retries."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key, max_retries=0)
