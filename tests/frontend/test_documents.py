"""frontend.documents: a document's page and the source panel's JSON, the cited span marked, for
the readers of its collection only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from retrieval.models import Chunk, Collection, Document

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw-alice")


@pytest.fixture
def handbook() -> Document:
    """Two chunks of one section, the second starting inside the first (an overlap)."""
    collection = Collection.objects.create(name="HR")
    document = Document.objects.create(collection=collection, title="handbook.md", file="x.md")
    text = "<b>Thirty</b> days of leave. Carried over until March."
    Chunk.objects.create(
        document=document, ordinal=0, text=text[:28], token_count=6, char_start=0, char_end=28,
    )  # fmt: skip
    Chunk.objects.create(
        document=document, ordinal=1, text=text[14:], token_count=8, char_start=14,
        char_end=len(text),
    )  # fmt: skip
    return document


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_page_and_its_json_are_for_the_collections_readers_only(alice, handbook) -> None:
    chunk = handbook.chunks.get(ordinal=1)
    page, text = f"/documents/{handbook.pk}/", f"/documents/{handbook.pk}/text/?chunk={chunk.pk}"
    client = logged_in(alice)
    assert client.get(page).status_code == 404
    assert client.get(text).status_code == 404
    assert Client().get(text).status_code == 404  # signed out: no redirect for the panel's fetch
    assert Client().get(page).status_code == 302
    handbook.collection.readers.add(alice)
    assert client.get(page).status_code == 200
    assert client.get(text).status_code == 200
    staff = logged_in(User.objects.create_user("staff", is_staff=True))
    assert staff.get(text).status_code == 200


def test_the_page_marks_the_cited_span_and_escapes_the_text(alice, handbook) -> None:
    handbook.collection.readers.add(alice)
    second = handbook.chunks.get(ordinal=1)
    response = logged_in(alice).get(f"/documents/{handbook.pk}/", {"chunk": second.pk})
    page = response.content.decode()
    assert "&lt;b&gt;Thirty&lt;/b&gt; " in page and "<b>Thirty" not in page  # never markup
    marked = page[page.index('<mark class="cited-span">') : page.index("</mark>")]
    assert "days of leave. Carried over until March." in marked and "Thirty" not in marked
    assert page.count("days of leave.") == 1  # the overlap is shown once
    assert f'id="chunk-{second.pk}"' in marked
    assert "<mark" not in logged_in(alice).get(f"/documents/{handbook.pk}/").content.decode()


def test_the_json_holds_the_text_in_runs_with_the_cited_one_marked(alice, handbook) -> None:
    handbook.collection.readers.add(alice)
    first = handbook.chunks.get(ordinal=0)
    body = logged_in(alice).get(f"/documents/{handbook.pk}/text/", {"chunk": first.pk}).json()
    assert body["title"] == "handbook.md" and body["collection"] == "HR"
    assert body["cited"] == {"chunk_id": first.pk, "page": None, "heading_path": []}
    runs = body["blocks"][0]["runs"]
    texts = [("".join(p["text"] for p in run["pieces"]), run["cited"]) for run in runs]
    assert texts == [
        ("<b>Thirty</b> days of leave.", True),
        (" Carried over until March.", False),
    ]
    assert body["page_url"] == f"/documents/{handbook.pk}/?chunk={first.pk}#chunk-{first.pk}"


def test_a_chunk_of_another_document_is_not_shown_or_marked(alice, handbook) -> None:
    handbook.collection.readers.add(alice)
    secret = Collection.objects.create(name="Board")
    minutes = Document.objects.create(collection=secret, title="minutes.md", file="m.md")
    hidden = Chunk.objects.create(
        document=minutes, ordinal=0, text="The board's secret.", token_count=4, char_start=0,
        char_end=19,
    )  # fmt: skip
    client = logged_in(alice)
    body = client.get(f"/documents/{handbook.pk}/text/", {"chunk": hidden.pk}).json()
    assert body["cited"] is None and "secret" not in str(body)
    page = client.get(f"/documents/{handbook.pk}/", {"chunk": hidden.pk}).content.decode()
    assert "secret" not in page and "<mark" not in page
    assert "no longer in this document" in page
    assert client.get(f"/documents/{handbook.pk}/text/", {"chunk": "x"}).json()["cited"] is None


def test_back_returns_to_the_conversation_the_page_was_opened_from(alice, handbook) -> None:
    handbook.collection.readers.add(alice)
    client = logged_in(alice)
    page = client.get(f"/documents/{handbook.pk}/", {"conversation": "12"}).content.decode()
    assert 'href="/c/12/" class="back-link"' in page
    page = client.get(f"/documents/{handbook.pk}/", {"conversation": "//evil"}).content.decode()
    assert 'href="/" class="back-link"' in page


def test_a_pdfs_page_shows_with_its_number_in_the_readers_language(alice) -> None:
    collection = Collection.objects.create(name="HR")
    collection.readers.add(alice)
    document = Document.objects.create(collection=collection, title="manual.pdf", file="x.pdf")
    chunks = [
        Chunk.objects.create(
            document=document,
            ordinal=ordinal,
            text="Thirty days",
            token_count=2,
            char_start=13 * ordinal,
            char_end=13 * ordinal + 11,
            page=ordinal + 1,
        )
        for ordinal in range(2)
    ]
    client = logged_in(alice)
    chinese = client.get(
        f"/documents/{document.pk}/", {"chunk": chunks[1].pk}, headers={"accept-language": "zh-CN"}
    ).content.decode()
    assert '<html lang="zh-hans">' in chinese
    assert "返回聊天" in chinese and "2 个段落" in chinese and "第 2 页" in chinese
    assert "排队中" in chinese  # the status, not yet ready
    english = client.get(
        f"/documents/{document.pk}/", {"chunk": chunks[1].pk}, headers={"accept-language": "en"}
    ).content.decode()
    assert "2 passages" in english and "page 2" in english
    assert "Cited passage on page 2" in english
    second_page = english[english.index("page 2") :]
    assert '<mark class="cited-span">' in second_page
