"""retrieval.admin (with forms): staff upload, progress, re-ingest, delete and search preview."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from retrieval.ingest import ingest
from retrieval.models import Chunk, Collection, Document
from tests.documents import HANDBOOK, KITCHEN

pytestmark = pytest.mark.django_db

UPLOAD = reverse("admin:retrieval_document_upload")
SEARCH = reverse("admin:retrieval_document_search")
PROGRESS = reverse("admin:retrieval_document_progress")
CHANGELIST = reverse("admin:retrieval_document_changelist")


@pytest.fixture
def admin_client(client):
    client.force_login(User.objects.create_superuser("boss", password="x"))
    return client


def upload(client, collection: Collection, files: dict[str, str | bytes], capture):
    uploads = [SimpleUploadedFile(name, data if isinstance(data, bytes) else data.encode())
               for name, data in files.items()]  # fmt: skip
    with capture(execute=True):
        return client.post(UPLOAD, {"collection": collection.pk, "files": uploads})


@pytest.mark.parametrize("url", [UPLOAD, SEARCH, PROGRESS, CHANGELIST])
def test_non_staff_users_are_sent_to_the_login_page(client, url: str) -> None:
    client.force_login(User.objects.create_user("member", password="x"))
    response = client.get(url)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_staff_without_the_add_permission_cannot_upload(client) -> None:
    client.force_login(User.objects.create_user("clerk", password="x", is_staff=True))
    assert client.get(UPLOAD).status_code == 403


def test_a_multi_file_upload_creates_and_ingests_every_document(
    admin_client, retriever, django_capture_on_commit_callbacks
) -> None:
    collection = Collection.objects.create(name="hr")
    files = {"handbook.md": HANDBOOK, "kitchen.txt": KITCHEN, "broken.pdf": b"%PDF-1.4 junk"}
    response = upload(admin_client, collection, files, django_capture_on_commit_callbacks)
    assert response.status_code == 302 and response["Location"] == CHANGELIST
    documents = {d.title: d for d in Document.objects.filter(collection=collection)}
    assert set(documents) == set(files)
    assert documents["handbook.md"].status == Document.Status.READY
    assert documents["kitchen.txt"].status == Document.Status.READY
    assert documents["broken.pdf"].status == Document.Status.FAILED
    assert documents["handbook.md"].created_by.username == "boss"
    assert retriever.vectors.ids() == set(Chunk.objects.values_list("id", flat=True))
    page = admin_client.get(CHANGELIST).content.decode()
    assert 'class="cachet-progress"' in page and "/ws/documents/" in page


def test_unsupported_or_oversized_files_are_refused_by_the_form(admin_client, settings) -> None:
    settings.CACHET_MAX_UPLOAD_MB = 1
    collection = Collection.objects.create(name="hr")
    response = admin_client.post(
        UPLOAD,
        {
            "collection": collection.pk,
            "files": [
                SimpleUploadedFile("tool.exe", b"MZ"),
                SimpleUploadedFile("big.txt", b"a" * (1024 * 1024 + 1)),
            ],
        },
    )
    assert response.status_code == 200
    errors = " ".join(response.context["form"].errors["files"])
    assert "tool.exe: unsupported type" in errors and "big.txt is larger than the 1 MB" in errors
    assert not Document.objects.exists()


def test_the_progress_view_reports_status_and_progress_as_json(admin_client, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    collection = Collection.objects.create(name="hr")
    done = Document.objects.create(collection=collection, title="a", status="ready", progress=100)
    busy = Document.objects.create(
        collection=collection, title="b", status="processing", progress=40
    )
    response = admin_client.get(PROGRESS, {"ids": f"{done.pk},{busy.pk}"})
    rows = {row["id"]: row for row in response.json()["documents"]}
    assert rows[busy.pk] == {"id": busy.pk, "status": "processing", "progress": 40, "error": ""}
    assert rows[done.pk]["status"] == "ready"
    assert admin_client.get(PROGRESS, {"ids": "1,x"}).status_code == 400


def test_the_reingest_action_queues_and_ingests_again(
    admin_client, retriever, django_capture_on_commit_callbacks
) -> None:
    collection = Collection.objects.create(name="hr")
    upload(admin_client, collection, {"kitchen.txt": KITCHEN}, django_capture_on_commit_callbacks)
    document = Document.objects.get()
    before = set(Chunk.objects.values_list("id", flat=True))
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            CHANGELIST, {"action": "reingest_selected", "_selected_action": [document.pk]}
        )
    assert response.status_code == 302
    document.refresh_from_db()
    after = set(Chunk.objects.values_list("id", flat=True))
    assert document.status == Document.Status.READY and len(after) == len(before)
    assert after != before and retriever.vectors.ids() == after


def test_deleting_documents_in_the_admin_removes_their_vectors(
    admin_client, retriever, django_capture_on_commit_callbacks
) -> None:
    collection = Collection.objects.create(name="hr")
    files = {"handbook.md": HANDBOOK, "kitchen.txt": KITCHEN}
    upload(admin_client, collection, files, django_capture_on_commit_callbacks)
    kitchen = Document.objects.get(title="kitchen.txt")
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(
            CHANGELIST,
            {"action": "delete_selected", "_selected_action": [kitchen.pk], "post": "yes"},
        )
    assert not Document.objects.filter(title="kitchen.txt").exists()
    assert retriever.vectors.ids() == set(Chunk.objects.values_list("id", flat=True))
    assert retriever.vectors.ids()


def test_the_search_preview_shows_the_top_k_chunks_with_scores(
    admin_client, retriever, django_capture_on_commit_callbacks
) -> None:
    collection = Collection.objects.create(name="hr")
    files = {"handbook.md": HANDBOOK, "kitchen.txt": KITCHEN}
    upload(admin_client, collection, files, django_capture_on_commit_callbacks)
    response = admin_client.get(SEARCH, {"query": "paid holiday days", "top_k": 1})
    hits = response.context["hits"]
    assert len(hits) == 1 and hits[0].document_title == "handbook.md"
    page = response.content.decode()
    assert page.count('class="search-hit"') == 1
    assert f"{hits[0].score:.4f}" in page and "thirty days" in page


def test_the_admin_shows_a_failure_reason_in_the_language_of_its_page(
    admin_client, retriever, settings, tmp_path
) -> None:
    settings.MEDIA_ROOT = tmp_path
    collection = Collection.objects.create(name="hr")
    document = Document.objects.create(
        collection=collection, title="huge.txt", file=ContentFile(b"x" * 2048, name="huge.txt")
    )
    settings.CACHET_MAX_UPLOAD_MB = 0  # beyond the upload limit: ingestion fails with a value
    ingest(document.pk, retriever)
    document.refresh_from_db()
    assert document.error == "The file is larger than the upload limit of 0 MB."
    chinese = "文件超过了 0 MB 的上传上限。"
    pages = {
        "changelist": CHANGELIST,
        "change form": reverse("admin:retrieval_document_change", args=[document.pk]),
    }
    for page, url in pages.items():
        html = admin_client.get(url, headers={"accept-language": "zh-hans"}).content.decode()
        assert chinese in html, page
        assert "upload limit" not in html, page
    rows = admin_client.get(PROGRESS, {"ids": document.pk}, headers={"accept-language": "zh-hans"})
    assert rows.json()["documents"][0]["error"] == chinese
    english = admin_client.get(PROGRESS, {"ids": document.pk}, headers={"accept-language": "en"})
    assert english.json()["documents"][0]["error"] == document.error
