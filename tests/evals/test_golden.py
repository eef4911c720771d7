"""evals.golden and the admin's "Add to golden set": rated answers become golden questions that
staff edit; members never reach them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from chat.models import AnswerFeedback, Conversation, Message
from evals.golden import cited_sources
from evals.models import GoldenQuestion
from retrieval.models import Chunk, Collection
from tests.documents import HANDBOOK, add_document

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> User:
    return User.objects.create_superuser("root", password="pw")


@pytest.fixture
def handbook() -> Collection:
    return Collection.objects.create(name="HR")


def chunk_of(collection: Collection, ordinal: int, text: str) -> Chunk:
    document = add_document(collection, f"part-{ordinal}.md", HANDBOOK)
    return Chunk.objects.create(
        document=document, ordinal=0, text=text, token_count=9, char_start=0, char_end=len(text)
    )


def rated(user: User, collection: Collection, rating: str, answer: str, chunks: list[Chunk]):
    conversation = Conversation.objects.create(owner=user)
    conversation.collections.add(collection)
    Message.objects.create(conversation=conversation, role="user", content="How much leave?")
    message = Message.objects.create(
        conversation=conversation,
        role="assistant",
        content=answer,
        sources=[
            {"n": n, "chunk_id": c.pk, "document_id": c.document_id, "document_title": "h"}
            for n, c in enumerate(chunks, start=1)
        ],
    )
    return AnswerFeedback.objects.create(message=message, user=user, rating=rating)


def run_action(client: Client, feedback: list[AnswerFeedback]):
    return client.post(
        reverse("admin:chat_answerfeedback_changelist"),
        {"action": "add_to_golden_set", "_selected_action": [f.pk for f in feedback]},
        follow=True,
    )


def test_cited_sources_are_the_numbers_the_answer_cites_or_all_when_it_cites_none() -> None:
    sources = [{"n": 1}, {"n": 2}, {"n": 3}]
    assert cited_sources("Thirty days [2], see also [3].", sources) == [{"n": 2}, {"n": 3}]
    assert cited_sources("Thirty days.", sources) == sources
    assert cited_sources("Thirty days [9].", sources) == sources


def test_the_admin_action_turns_rated_answers_into_golden_questions(staff, handbook) -> None:
    alice = User.objects.create_user("alice")
    leave, travel = chunk_of(handbook, 1, "thirty days"), chunk_of(handbook, 2, "trains")
    up = rated(alice, handbook, "up", "Thirty days of paid holiday [1].", [leave, travel])
    down = rated(alice, handbook, "down", "Ten days.", [travel])
    client = Client()
    client.force_login(staff)

    page = run_action(client, [up, down]).content.decode()
    assert "2 questions added to the golden set." in page
    assert "1 was rated down: write its expected answer in the golden set." in page

    from_up = GoldenQuestion.objects.get(feedback=up)
    assert from_up.question == "How much leave?"
    assert from_up.expected_answer == "Thirty days of paid holiday [1]."
    assert list(from_up.expected_chunks.all()) == [leave]  # only the cited passage
    assert list(from_up.expected_documents.all()) == [leave.document]
    assert list(from_up.collections.all()) == [handbook]
    assert from_up.created_by == staff and from_up.is_active
    from_down = GoldenQuestion.objects.get(feedback=down)
    assert from_down.expected_answer == ""  # a wrong answer never becomes the reference
    assert list(from_down.expected_chunks.all()) == [travel]

    again = run_action(client, [up]).content.decode()
    assert "0 questions added to the golden set." in again
    assert "1 was already in the golden set." in again
    assert GoldenQuestion.objects.count() == 2


def test_staff_edit_a_golden_question_in_the_admin(staff, handbook) -> None:
    leave = chunk_of(handbook, 1, "thirty days")
    golden = GoldenQuestion.objects.create(question="How much leave?")
    client = Client()
    client.force_login(staff)
    url = reverse("admin:evals_goldenquestion_change", args=[golden.pk])
    assert client.get(url).status_code == 200
    response = client.post(
        url,
        {
            "question": "How many days of paid holiday?",
            "expected_answer": "Thirty days.",
            "expected_chunks": str(leave.pk),
            "expected_documents": str(leave.document_id),
            "collections": [handbook.pk],
            "is_active": "on",
            "feedback": "",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    golden.refresh_from_db()
    assert golden.expected_answer == "Thirty days."
    assert list(golden.expected_chunks.all()) == [leave]
    listing = client.get(reverse("admin:evals_goldenquestion_changelist")).content.decode()
    assert "How many days of paid holiday?" in listing
    assert 'href="/staff/evaluation/"' in listing  # where the golden set is run
    runs = client.get(reverse("admin:evals_evalrun_changelist")).content.decode()
    assert 'href="/staff/evaluation/"' in runs


def test_members_never_reach_the_golden_set() -> None:
    member = User.objects.create_user("alice")
    client = Client()
    client.force_login(member)
    for name in ("admin:evals_goldenquestion_changelist", "admin:chat_answerfeedback_changelist"):
        response = client.get(reverse(name))
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_only_staff_allowed_to_add_golden_questions_may_add_them_from_feedback(handbook) -> None:
    member = User.objects.create_user("ann")
    reviewer = User.objects.create_user("rita", is_staff=True)
    # Rita may read and edit feedback, but not add golden questions.
    reviewer.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="chat",
            codename__in=["view_answerfeedback", "change_answerfeedback"],
        )
    )
    feedback = rated(member, handbook, "up", "Thirty days [1].", [chunk_of(handbook, 0, "30")])
    client = Client()
    client.force_login(reviewer)
    listing = client.get(reverse("admin:chat_answerfeedback_changelist")).content.decode()
    assert "add_to_golden_set" not in listing
    run_action(client, [feedback])
    assert not GoldenQuestion.objects.exists()

    reviewer.user_permissions.add(Permission.objects.get(codename="add_goldenquestion"))
    client.force_login(User.objects.get(pk=reviewer.pk))  # permissions are cached per user object
    run_action(client, [feedback])
    assert GoldenQuestion.objects.get().feedback == feedback
