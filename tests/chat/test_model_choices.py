"""The models the chat's picker offers (GET /chat/api/options/ `models`): this server's first,
then each enabled remote backend's, once each; a disabled backend offers nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from backends.models import InferenceBackend
from chat.model_choices import local_model_name

pytestmark = pytest.mark.django_db


@pytest.fixture
def member() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("alice", password="pw-alice"))
    return client


def remote(name: str, model: str, **fields) -> InferenceBackend:
    return InferenceBackend.objects.create(
        name=name, base_url=f"http://{name}.invalid/v1", model=model, **fields
    )


def test_without_a_remote_backend_only_this_servers_model_is_offered(member) -> None:
    models = member.get("/chat/api/options/").json()["models"]
    assert models == [{"name": local_model_name(), "is_local": True}]


def test_enabled_remote_models_follow_the_local_one_once_each(member) -> None:
    remote("replica-a", "big-model")
    remote("replica-b", "big-model")  # two replicas of one model: one choice
    remote("other", "other-model")
    remote("resting", "resting-model", is_enabled=False)
    models = member.get("/chat/api/options/").json()["models"]
    assert models == [
        {"name": local_model_name(), "is_local": True},
        {"name": "big-model", "is_local": False},
        {"name": "other-model", "is_local": False},
    ]
