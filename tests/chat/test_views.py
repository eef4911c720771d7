"""chat.views: the UI's JSON endpoints: own conversations only, rename, delete, options, upload."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from chat.models import AssistantProfile, Conversation, Message
from retrieval.models import Collection, Document
from tests import malicious_files as bad

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw")


@pytest.fixture
def client_for():
    def make(user: User, *, enforce_csrf: bool = False) -> Client:
        client = Client(enforce_csrf_checks=enforce_csrf)
        client.force_login(user)
        return client

    return make


def conversation_of(user: User, title: str = "t") -> Conversation:
    conversation = Conversation.objects.create(owner=user, title=title)
    Message.objects.create(conversation=conversation, role="user", content="q")
    Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="a [1]",
        sources=[{"n": 1, "document_title": "d"}],
        prompt_tokens=10,
        cached_tokens=4,
        finish_reason="stop",
    )
    return conversation


def test_the_list_holds_only_the_users_own_conversations_newest_first(alice, client_for):
    bob = User.objects.create_user("bob")
    older, newer = conversation_of(alice, "older"), conversation_of(alice, "newer")
    conversation_of(bob, "bob's")
    body = client_for(alice).get("/chat/api/conversations/").json()
    assert [c["id"] for c in body["conversations"]] == [newer.pk, older.pk]


def test_a_conversation_comes_with_its_messages_sources_and_stats(alice, client_for):
    conversation = conversation_of(alice)
    body = client_for(alice).get(f"/chat/api/conversations/{conversation.pk}/").json()
    question, answer = body["messages"]
    assert question["role"] == "user" and question["stats"] is None
    assert answer["sources"] == [{"n": 1, "document_title": "d"}]
    assert answer["stats"]["cached_tokens"] == 4 and answer["finish_reason"] == "stop"


@pytest.mark.parametrize("method", ["get", "patch", "delete"])
def test_another_users_conversation_answers_404_like_a_missing_one(alice, client_for, method):
    theirs = conversation_of(User.objects.create_user("bob"))
    client = client_for(alice)
    for conversation_id in (theirs.pk, 987654):
        url = f"/chat/api/conversations/{conversation_id}/"
        if method == "get":
            response = client.get(url)
        else:
            body = json.dumps({"title": "mine now"})
            response = getattr(client, method)(url, body, content_type="application/json")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    theirs.refresh_from_db()
    assert theirs.title == "t"


def test_rename_and_delete_change_the_users_own_conversation(alice, client_for):
    conversation = conversation_of(alice)
    client = client_for(alice)
    url = f"/chat/api/conversations/{conversation.pk}/"
    response = client.patch(url, {"title": "  Holiday   rules "}, content_type="application/json")
    assert response.json()["title"] == "Holiday rules"
    bad = client.patch(url, {"title": ""}, content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"
    assert client.patch(url, "{oops", content_type="application/json").status_code == 400
    assert client.delete(url).status_code == 204
    assert not Conversation.objects.exists() and not Message.objects.exists()


def test_changes_need_the_csrf_token(alice, client_for):
    conversation = conversation_of(alice)
    client = client_for(alice, enforce_csrf=True)
    url = f"/chat/api/conversations/{conversation.pk}/"
    assert client.delete(url).status_code == 403
    client.get("/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    assert client.delete(url, headers={"X-CSRFToken": token}).status_code == 204


def test_anonymous_requests_get_401(client):
    for path in ("/chat/api/options/", "/chat/api/conversations/", "/chat/api/conversations/1/"):
        response = client.get(path)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthenticated"


def test_options_list_readable_collections_profiles_and_upload_rights(alice, client_for):
    readable, _hidden = Collection.objects.create(name="HR"), Collection.objects.create(name="x")
    readable.readers.add(alice)
    AssistantProfile.objects.create(name="Helper", is_default=True)
    body = client_for(alice).get("/chat/api/options/").json()
    assert body["collections"] == [{"id": readable.pk, "name": "HR"}]
    assert body["profiles"][0]["name"] == "Helper" and body["profiles"][0]["is_default"]
    assert body["upload"]["allowed"] is False and body["max_message_chars"] == 8000


def test_staff_upload_a_document_and_get_its_id_for_progress(client_for, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    staff = User.objects.create_user("staff", is_staff=True)
    collection = Collection.objects.create(name="HR")
    client = client_for(staff)
    upload = SimpleUploadedFile("notes.txt", b"Plain text notes.")
    response = client.post("/chat/api/documents/", {"file": upload, "collection": collection.pk})
    assert response.status_code == 201, response.content
    document = Document.objects.get(pk=response.json()["document"]["id"])
    assert document.title == "notes.txt" and document.created_by == staff
    # NOTE: queued on commit (this test's transaction never commits); retrieval tests ingest.
    assert document.status == Document.Status.QUEUED


def test_uploads_are_refused_to_members_and_checked_for_size_and_type(
    alice, client_for, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path
    settings.CACHET_MAX_UPLOAD_MB = 1
    collection = Collection.objects.create(name="HR")
    file = SimpleUploadedFile("a.txt", b"x")
    member = client_for(alice).post("/chat/api/documents/", {"file": file, "collection": 1})
    assert member.status_code == 403

    staff = client_for(User.objects.create_user("staff", is_staff=True))
    big = SimpleUploadedFile("big.txt", b"x" * (1024 * 1024 + 1))
    response = staff.post("/chat/api/documents/", {"file": big, "collection": collection.pk})
    assert response.status_code == 413 and "1 MB" in response.json()["error"]["message"]
    exe = SimpleUploadedFile("tool.exe", b"MZ")
    response = staff.post("/chat/api/documents/", {"file": exe, "collection": collection.pk})
    assert response.status_code == 400 and "unsupported" in response.json()["error"]["message"]
    assert not Document.objects.exists()


def test_an_upload_needs_the_csrf_token(client_for, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    collection = Collection.objects.create(name="HR")
    client = client_for(User.objects.create_user("staff", is_staff=True), enforce_csrf=True)
    upload = SimpleUploadedFile("notes.txt", b"Plain text notes.")
    response = client.post("/chat/api/documents/", {"file": upload, "collection": collection.pk})
    assert response.status_code == 403 and not Document.objects.exists()


def test_an_empty_upload_is_refused_with_400(client_for, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    collection = Collection.objects.create(name="HR")
    client = client_for(User.objects.create_user("staff", is_staff=True))
    empty = SimpleUploadedFile("empty.docx", b"")
    response = client.post("/chat/api/documents/", {"file": empty, "collection": collection.pk})
    assert response.status_code == 400 and "empty" in response.json()["error"]["message"]
    assert not Document.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("name", "build", "reason"),
    [
        ("bomb.docx", lambda: bad.docx_bomb(300), "may be a zip bomb"),
        ("bomb.pdf", lambda: bad.pdf_flate_bomb(300), "safety limit of the PDF reader"),
        ("text.pdf", lambda: b"Plain text with a .pdf name.", "PDF is corrupt or unreadable"),
    ],
)
def test_hostile_uploads_are_accepted_then_end_failed_with_a_reason(
    retriever, client_for, name, build, reason
):
    # NOTE: with tasks in-process, ingestion runs inside the upload request when it commits.
    collection = Collection.objects.create(name="HR")
    client = client_for(User.objects.create_user("staff", is_staff=True))
    upload = SimpleUploadedFile(name, build())
    with bad.time_limit(60):
        response = client.post(
            "/chat/api/documents/", {"file": upload, "collection": collection.pk}
        )
    assert response.status_code == 201, response.content
    document = Document.objects.get(pk=response.json()["document"]["id"])
    assert document.status == Document.Status.FAILED and reason in document.error
