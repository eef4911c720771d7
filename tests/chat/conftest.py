"""Fixtures of the chat tests: a profile with short answers, two users, an ingested handbook."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from chat.models import AssistantProfile
from retrieval.ingest import ingest
from retrieval.models import Collection
from tests.documents import HANDBOOK, add_document


@pytest.fixture
def quick_profile(transactional_db) -> AssistantProfile:
    """The default profile, sampling at temperature 0.8 and answering in at most 24 tokens."""
    return AssistantProfile.objects.create(
        name="Quick", is_default=True, temperature=0.8, top_p=0.95, max_tokens=24
    )


@pytest.fixture
def handbook(retriever) -> Collection:
    collection = Collection.objects.create(name="HR")
    ingest(add_document(collection, "handbook.md", HANDBOOK).pk, retriever)
    return collection


@pytest.fixture
def alice(transactional_db) -> User:
    return User.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def bob(transactional_db) -> User:
    return User.objects.create_user("bob", password="pw-bob")
