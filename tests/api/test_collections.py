"""api.collections: staff create, rename, share and delete collections; readers list theirs."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from retrieval.ingest import ingest
from retrieval.models import Chunk, Collection, Document
from tests.api.key_clients import client_for
from tests.documents import HANDBOOK, add_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_limits")]


def post(client: Client, path: str, body: dict):
    return client.post(path, body, content_type="application/json")


def patch(client: Client, path: str, body: dict):
    return client.patch(path, body, content_type="application/json")


def names(client: Client) -> list[str]:
    response = client.get("/v1/collections")
    assert response.status_code == 200, response.content
    return [collection["name"] for collection in response.json()["data"]]


def test_staff_create_rename_and_share_a_collection_that_its_readers_then_list(staff, member):
    user, member_client = member
    Group.objects.create(name="engineering")
    response = post(staff, "/v1/collections", {"name": "HR", "description": "Policies"})
    assert response.status_code == 201, response.content
    created = response.json()
    assert (created["object"], created["name"], created["description"]) == (
        "collection", "HR", "Policies"
    )  # fmt: skip
    assert created["readers"] == [] and created["num_documents"] == 0
    assert names(member_client) == []
    assert member_client.get(f"/v1/collections/{created['id']}").status_code == 404

    path = f"/v1/collections/{created['id']}"
    response = patch(staff, path, {"name": "People", "readers": ["member"]})
    assert response.status_code == 200, response.content
    assert response.json()["name"] == "People" and response.json()["readers"] == ["member"]
    assert response.json()["description"] == "Policies"  # fields not given stay
    assert names(member_client) == ["People"]
    shown = member_client.get(path).json()
    assert shown["name"] == "People" and "readers" not in shown  # readers are staff's business

    response = patch(staff, path, {"readers": [], "reader_groups": ["engineering"]})
    assert response.json()["readers"] == [] and response.json()["reader_groups"] == ["engineering"]
    assert names(member_client) == []
    user.groups.add(Group.objects.get(name="engineering"))
    assert names(member_client) == ["People"]
    assert names(staff) == ["People"]


def test_members_may_not_create_change_or_delete_collections(member):
    user, member_client = member
    shared = Collection.objects.create(name="HR")
    shared.readers.add(user)
    path = f"/v1/collections/{shared.pk}"
    for response in (
        post(member_client, "/v1/collections", {"name": "Mine"}),
        patch(member_client, path, {"name": "Taken over"}),
        member_client.delete(path),
    ):
        assert response.status_code == 403
        assert response.json()["error"]["type"] == "permission_error"
    assert list(Collection.objects.values_list("name", flat=True)) == ["HR"]


def test_bad_collection_requests_get_openais_errors_and_change_nothing(staff):
    hr = Collection.objects.create(name="HR")
    response = post(staff, "/v1/collections", {"name": "HR"})
    assert response.status_code == 409 and response.json()["error"]["param"] == "name"
    response = post(staff, "/v1/collections", {"name": "Ops", "readers": ["nobody"]})
    assert response.status_code == 400 and "'nobody'" in response.json()["error"]["message"]
    response = post(staff, "/v1/collections", {"name": "Ops", "reader_groups": ["ghosts"]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "reader_groups"
    for body in ({"name": ""}, {"name": 7}, {"description": "no name"}, {"name": "x" * 201}):
        response = post(staff, "/v1/collections", body)
        assert response.status_code == 400, body
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert list(Collection.objects.values_list("name", flat=True)) == ["HR"]

    other = Collection.objects.create(name="Ops")
    response = patch(staff, f"/v1/collections/{other.pk}", {"name": "HR"})
    assert response.status_code == 409
    response = patch(staff, f"/v1/collections/{hr.pk}", {"name": "New", "readers": ["nobody"]})
    assert response.status_code == 400
    assert sorted(Collection.objects.values_list("name", flat=True)) == ["HR", "Ops"]
    assert staff.get("/v1/collections/999999").status_code == 404
    assert staff.delete("/v1/collections/999999").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_deleting_a_collection_deletes_its_documents_files_and_vectors(retriever):
    staff = client_for(User.objects.create_user("staff", is_staff=True))
    hr, kept = Collection.objects.create(name="HR"), Collection.objects.create(name="Ops")
    document = add_document(hr, "handbook.md", HANDBOOK)
    other = add_document(kept, "ops.md", "# Ops\n\nThe servers are patched on Mondays.")
    for ingested in (document, other):
        ingest(ingested.pk, retriever)
    document.refresh_from_db()
    file_path = Path(document.file.path)
    chunk_ids = set(Chunk.objects.filter(document=document).values_list("id", flat=True))
    kept_ids = set(Chunk.objects.filter(document=other).values_list("id", flat=True))
    assert file_path.is_file() and chunk_ids | kept_ids <= retriever.vectors.ids()

    response = staff.delete(f"/v1/collections/{hr.pk}")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "id": hr.pk, "object": "collection", "deleted": True, "num_documents_deleted": 1
    }  # fmt: skip
    assert list(Document.objects.values_list("title", flat=True)) == ["ops.md"]
    assert not file_path.exists()
    vector_ids = retriever.vectors.ids()
    assert not chunk_ids & vector_ids and kept_ids <= vector_ids
    assert names(staff) == ["Ops"]
