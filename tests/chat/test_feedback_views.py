"""chat.feedback_views: thumbs and notes on one's own answers; nobody else reads or writes them."""

from __future__ import annotations

import json

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from chat.admin import AnswerFeedbackAdmin
from chat.models import AnswerFeedback, Conversation, Message

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw")


@pytest.fixture
def bob() -> User:
    return User.objects.create_user("bob", password="pw")


def client_of(user: User, *, enforce_csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=enforce_csrf)
    client.force_login(user)
    return client


def answer_of(user: User, content: str = "Thirty days [1].") -> Message:
    conversation = Conversation.objects.create(owner=user, title="leave")
    Message.objects.create(conversation=conversation, role="user", content="How much leave?")
    return Message.objects.create(
        conversation=conversation,
        role="assistant",
        content=content,
        model="smollm2-135m-instruct",
        sources=[{"n": 1, "document_title": "handbook.md", "url": "/documents/1/?chunk=2"}],
        finish_reason="stop",
    )


def url(message: Message | int) -> str:
    message_id = message if isinstance(message, int) else message.pk
    return f"/chat/api/messages/{message_id}/feedback/"


def put(client: Client, message: Message, body: object):
    return client.put(url(message), json.dumps(body), content_type="application/json")


def test_a_thumb_and_note_are_saved_changed_and_cleared(alice) -> None:
    answer, client = answer_of(alice), client_of(alice)
    assert client.get(url(answer)).json() == {"feedback": None}

    response = put(client, answer, {"rating": "up"})
    assert response.status_code == 200
    assert response.json()["feedback"]["rating"] == "up"
    assert response.json()["feedback"]["note"] == ""

    response = put(client, answer, {"rating": "down", "note": "  It is 30 days, not 20.  "})
    assert response.json()["feedback"] | {"updated_at": None} == {
        "rating": "down",
        "note": "It is 30 days, not 20.",
        "updated_at": None,
    }
    assert AnswerFeedback.objects.get(message=answer, user=alice).rating == "down"
    assert AnswerFeedback.objects.count() == 1  # changed, not added

    assert client.delete(url(answer)).status_code == 204
    assert not AnswerFeedback.objects.exists()
    assert client.get(url(answer)).json() == {"feedback": None}


def test_the_conversation_brings_each_answers_feedback_back(alice) -> None:
    answer, client = answer_of(alice), client_of(alice)
    put(client, answer, {"rating": "up", "note": "clear"})
    body = client.get(f"/chat/api/conversations/{answer.conversation_id}/").json()
    question, rated = body["messages"]
    assert question["feedback"] is None
    assert rated["feedback"]["rating"] == "up" and rated["feedback"]["note"] == "clear"


@pytest.mark.parametrize("method", ["get", "put", "delete"])
def test_another_users_answer_a_question_or_a_missing_id_answers_404(alice, bob, method) -> None:
    theirs = answer_of(alice)
    AnswerFeedback.objects.create(message=theirs, user=alice, rating="up", note="mine")
    question = Message.objects.get(conversation=theirs.conversation, role="user")
    client = client_of(bob)
    for target in (theirs, question.pk, 987654):
        if method == "put":
            response = put(client, target, {"rating": "down", "note": "bob was here"})
        else:
            response = getattr(client, method)(url(target))
        assert response.status_code == 404, target
        assert response.json()["error"]["code"] == "not_found"
        assert "mine" not in response.content.decode()
    feedback = AnswerFeedback.objects.get()
    assert (feedback.user, feedback.rating, feedback.note) == (alice, "up", "mine")


def test_rating_needs_a_login_and_the_csrf_token(alice) -> None:
    answer = answer_of(alice)
    anonymous = Client().put(url(answer), '{"rating": "up"}', content_type="application/json")
    assert anonymous.status_code == 401
    response = client_of(alice, enforce_csrf=True).put(
        url(answer), '{"rating": "up"}', content_type="application/json"
    )
    assert response.status_code == 403
    assert not AnswerFeedback.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"rating": "meh"},
        {},
        {"rating": "up", "note": 5},
        {"rating": "up", "note": "x" * (AnswerFeedback.NOTE_MAX_CHARS + 1)},
        ["up"],
    ],
)
def test_a_bad_rating_or_note_is_refused_and_keeps_the_saved_one(alice, body) -> None:
    answer, client = answer_of(alice), client_of(alice)
    put(client, answer, {"rating": "up", "note": "kept"})
    response = put(client, answer, body)
    assert response.status_code == 400
    assert response.json()["error"]["message"]
    assert AnswerFeedback.objects.get().note == "kept"


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b"[" * 100_000, b'{"a":' * 100_000])
def test_a_body_that_is_not_json_is_refused_with_bad_json_and_keeps_the_saved_one(
    alice, raw
) -> None:
    answer, client = answer_of(alice), client_of(alice)
    put(client, answer, {"rating": "up", "note": "kept"})
    response = client.put(url(answer), raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_json"
    assert AnswerFeedback.objects.get().note == "kept"


def test_the_admin_lists_feedback_with_question_answer_note_model_and_sources(alice) -> None:
    answer = answer_of(alice)
    feedback = AnswerFeedback.objects.create(message=answer, user=alice, rating="down", note="no")
    staff = User.objects.create_superuser("root", password="pw")
    client = client_of(staff)
    listing = client.get(reverse("admin:chat_answerfeedback_changelist") + "?rating__exact=down")
    text = listing.content.decode()
    assert listing.status_code == 200
    for shown in ("How much leave?", "Thirty days [1].", "smollm2-135m-instruct", "alice"):
        assert shown in text
    assert "Thumbs down" in text
    assert "1 answer feedback" in text
    assert (
        "0 answer feedback"
        in client.get(
            reverse("admin:chat_answerfeedback_changelist") + "?rating__exact=up"
        ).content.decode()
    )
    page = client.get(reverse("admin:chat_answerfeedback_change", args=[feedback.pk]))
    detail = page.content.decode()
    assert "handbook.md" in detail and "/documents/1/?chunk=2" in detail
    assert isinstance(site._registry[AnswerFeedback], AnswerFeedbackAdmin)


def test_members_never_reach_the_feedback_admin(alice) -> None:
    response = client_of(alice).get(reverse("admin:chat_answerfeedback_changelist"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
