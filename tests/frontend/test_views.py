"""frontend.views: the chat page, a document's text, log-in and log-out."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from chat.models import Conversation
from retrieval.models import Chunk, Collection, Document

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw-alice")


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_chat_page_needs_a_login_and_sets_the_csrf_cookie(client, alice):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=/")
    client.force_login(alice)
    response = client.get("/")
    assert response.status_code == 200
    assert b'id="chat-config"' in response.content
    assert "csrftoken" in response.cookies


def test_logging_in_with_the_form_leads_to_the_chat(client, alice):
    page = client.get("/login/")
    assert page.status_code == 200 and b'name="username"' in page.content
    response = client.post("/login/", {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302 and response["Location"] == "/"
    refused = Client().post("/login/", {"username": "alice", "password": "wrong"})
    assert refused.status_code == 200 and b"correct username and password" in refused.content


def test_logout_is_a_post(alice):
    client = logged_in(alice)
    assert client.get("/logout/").status_code == 405
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_a_conversation_page_opens_only_for_its_owner(alice):
    mine = Conversation.objects.create(owner=alice)
    theirs = Conversation.objects.create(owner=User.objects.create_user("bob"))
    client = logged_in(alice)
    assert client.get(f"/c/{mine.pk}/").status_code == 200
    assert client.get(f"/c/{theirs.pk}/").status_code == 404
    assert client.get("/c/987654/").status_code == 404


def test_a_document_page_shows_its_chunks_to_readers_only(alice):
    collection = Collection.objects.create(name="HR")
    document = Document.objects.create(collection=collection, title="handbook.md", file="x.md")
    chunk = Chunk.objects.create(
        document=document, ordinal=0, text="<b>Thirty</b> days", token_count=3,
        char_start=0, char_end=18,
    )  # fmt: skip
    client = logged_in(alice)
    assert client.get(f"/documents/{document.pk}/").status_code == 404
    collection.readers.add(alice)
    response = client.get(f"/documents/{document.pk}/")
    assert response.status_code == 200
    assert f'id="chunk-{chunk.pk}"'.encode() in response.content
    assert b"&lt;b&gt;Thirty&lt;/b&gt; days" in response.content  # escaped, never markup
