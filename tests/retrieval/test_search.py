"""retrieval.search: real embedder, real faiss, real BM25, permission-filtered."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from retrieval.ingest import ingest
from retrieval.models import Chunk, Collection, Document
from retrieval.search import search
from tests.documents import HANDBOOK, KITCHEN, add_document

pytestmark = pytest.mark.django_db


def test_ingest_makes_chunks_and_vectors_and_search_cites_them(retriever) -> None:
    collection = Collection.objects.create(name="hr")
    document = add_document(collection, "handbook.md", HANDBOOK)
    ingest(document.pk, retriever)
    document.refresh_from_db()
    assert document.status == Document.Status.READY and document.progress == 100
    assert len(document.content_hash) == 64 and document.mime_type == "text/markdown"
    ids = set(Chunk.objects.filter(document=document).values_list("id", flat=True))
    assert ids and retriever.vectors.ids() == ids
    hits = search("how many holiday days do I get", top_k=1)
    assert hits[0].document_title == "handbook.md"
    assert hits[0].heading_path == ["Handbook", "Leave"]
    assert "thirty days" in hits[0].text


def test_users_only_find_collections_they_may_read(retriever) -> None:
    hr = Collection.objects.create(name="hr")
    ops = Collection.objects.create(name="ops")
    ingest(add_document(hr, "handbook.md", HANDBOOK).pk, retriever)
    ingest(add_document(ops, "kitchen.txt", KITCHEN).pk, retriever)
    reader = User.objects.create_user("reader")
    team = Group.objects.create(name="ops-team")
    member = User.objects.create_user("member")
    member.groups.add(team)
    hr.readers.add(reader)
    ops.reader_groups.add(team)
    assert {h.collection_name for h in search("kitchen holiday", top_k=10, user=reader)} == {"hr"}
    assert {h.collection_name for h in search("kitchen holiday", top_k=10, user=member)} == {"ops"}
    assert search("kitchen", [hr], top_k=10, user=member) == []
    staff = User.objects.create_user("staff", is_staff=True)
    assert {h.collection_name for h in search("kitchen holiday", top_k=10, user=staff)} == {
        "hr",
        "ops",
    }


def test_deleting_a_document_removes_its_vectors(
    retriever, django_capture_on_commit_callbacks
) -> None:
    collection = Collection.objects.create(name="ops")
    document = add_document(collection, "kitchen.txt", KITCHEN)
    ingest(document.pk, retriever)
    with django_capture_on_commit_callbacks(execute=True):
        document.delete()
    assert retriever.vectors.ids() == set()


def test_every_mode_answers_and_bad_input_is_refused(retriever) -> None:
    collection = Collection.objects.create(name="ops")
    ingest(add_document(collection, "kitchen.txt", KITCHEN).pk, retriever)
    for mode in ("bm25", "dense", "hybrid", "hybrid+rerank"):
        assert search("kitchen", top_k=3, mode=mode)[0].document_title == "kitchen.txt"
    assert search("   ", top_k=3) == []
    with pytest.raises(ValueError, match="top_k"):
        search("kitchen", top_k=0)
    with pytest.raises(ValueError, match="mode"):
        search("kitchen", top_k=1, mode="magic")
