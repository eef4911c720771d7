"""chat.models: profiles, ownership, the protocol's Message shape, chat titles."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, User

from chat.models import (
    DEFAULT_PROFILE_NAME,
    AssistantProfile,
    Conversation,
    Message,
    title_from,
)

pytestmark = pytest.mark.django_db


def test_the_default_profile_is_created_once_when_none_exists():
    profile = AssistantProfile.default()
    assert profile.name == DEFAULT_PROFILE_NAME and profile.is_default
    assert AssistantProfile.default() == profile
    assert AssistantProfile.objects.count() == 1


def test_making_a_profile_default_unsets_the_previous_default():
    first = AssistantProfile.objects.create(name="a", is_default=True)
    second = AssistantProfile.objects.create(name="b", is_default=True)
    first.refresh_from_db()
    assert not first.is_default and AssistantProfile.default() == second


def test_users_own_only_their_conversations_and_anonymous_users_none():
    alice, bob = User.objects.create_user("alice"), User.objects.create_user("bob")
    mine = Conversation.objects.create(owner=alice)
    Conversation.objects.create(owner=bob)
    assert list(Conversation.objects.owned_by(alice)) == [mine]
    assert not Conversation.objects.owned_by(AnonymousUser()).exists()
    alice.is_active = False
    assert not Conversation.objects.owned_by(alice).exists()


def test_messages_serialise_to_the_protocol_shape():
    conversation = Conversation.objects.create(owner=User.objects.create_user("alice"))
    question = Message.objects.create(
        conversation=conversation, role="user", content="q", sources=[{"n": 1}]
    )
    answer = Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="a",
        sources=[{"n": 1}],
        ttft_s=0.5,
        prompt_tokens=100,
        cached_tokens=80,
        completion_tokens=7,
        finish_reason="stopped",
        model="m",
    )
    assert question.as_json()["sources"] == [] and question.as_json()["stats"] is None
    body = answer.as_json()
    assert body["finish_reason"] == "stopped" and body["sources"] == [{"n": 1}]
    assert body["stats"] == {
        "ttft_s": 0.5,
        "tokens_per_s": None,
        "prompt_tokens": 100,
        "cached_tokens": 80,
        "prompt_cache_hit_tokens": 80,
        "prompt_cache_miss_tokens": 20,
        "reused_tokens": 0,
        "completion_tokens": 7,
        "total_s": None,
        "model": "m",
        "backend": "",
        "route": "",
    }


def test_prompt_tokens_from_reused_passages_are_neither_cache_hits_nor_misses():
    conversation = Conversation.objects.create(owner=User.objects.create_user("alice"))
    answer = Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="a",
        prompt_tokens=1000,
        cached_tokens=300,
        reused_tokens=550,
    )
    stats = answer.as_json()["stats"]
    assert stats["prompt_cache_hit_tokens"] == 300 and stats["reused_tokens"] == 550
    assert stats["prompt_cache_miss_tokens"] == 150


@pytest.mark.parametrize(
    ("question", "title"),
    [
        ("  How many\n holidays? ", "How many holidays?"),
        ("", "New chat"),
        ("word " * 40, ("word " * 15).strip() + "…"),
        ("x" * 200, "x" * 79 + "…"),
    ],
)
def test_a_title_is_the_first_question_on_one_line_cut_at_a_word(question, title):
    assert title_from(question) == title
    assert len(title_from(question)) <= 80
