"""Shared fixtures of the chat tests: the process engine on the real default model, a profile
with short answers, and a collection with an ingested handbook."""

# ruff: noqa: F811 - fixtures are imported by name
from __future__ import annotations

import asyncio
import time

import pytest
from django.contrib.auth.models import User

from chat.models import AssistantProfile
from inference import runtime
from inference.models import ModelConfig
from retrieval.ingest import ingest
from retrieval.models import Collection
from tests.retrieval_fixtures import HANDBOOK, add_document, retriever  # noqa: F401

FLOAT32_CONFIG_NAME = "tests-float32"


@pytest.fixture
def served_engine(chat_model_dir, transactional_db):
    """The runtime's engine on the default model in float32, loaded once and kept between tests.

    float32, because tests compare streamed answers with non-streamed ones token for token; in
    bf16 a cold prefill and a cache hit round differently and sampled answers may part ways.
    """
    status = runtime.engine_status()
    if status["status"] != "ready" or status["config"] != FLOAT32_CONFIG_NAME:
        runtime.stop_engine()
        runtime.reload_engine(ModelConfig(name=FLOAT32_CONFIG_NAME, dtype="float32"), wait=True)
    return runtime.get_engine()


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


def kv_is_idle(engine) -> bool:
    snapshot = engine.metrics.snapshot()
    return snapshot["kv_usage"] == 0 and snapshot["num_running"] == 0


async def wait_for_idle_kv(engine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not kv_is_idle(engine):
        if time.monotonic() > deadline:
            raise AssertionError(f"KV cache not idle: {engine.metrics.snapshot()}")
        await asyncio.sleep(0.01)
