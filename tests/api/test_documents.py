"""api.documents: upload, list, status, delete and search with the UI's permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from retrieval.ingest import ingest
from retrieval.models import Collection, Document
from tests import malicious_files as bad
from tests.api.key_clients import client_for
from tests.documents import HANDBOOK, add_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_limits")]


@pytest.fixture
def hr() -> Collection:
    return Collection.objects.create(name="HR")


def test_staff_upload_a_document_and_get_its_status(staff, hr, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    upload = SimpleUploadedFile("notes.md", b"# Notes\n\nKitchen cleaned on Fridays.")
    response = staff.post("/v1/documents", {"file": upload, "collection": hr.pk})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["title"] == "notes.md" and body["collection"] == {"id": hr.pk, "name": "HR"}
    assert body["status"] == "queued"
    status = staff.get(f"/v1/documents/{body['id']}").json()
    assert status["id"] == body["id"] and status["progress"] == 0


def test_uploads_are_checked_for_rights_size_and_type(staff, member, hr, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    settings.CACHET_MAX_UPLOAD_MB = 1
    _, member_client = member
    small = SimpleUploadedFile("a.txt", b"x")
    response = member_client.post("/v1/documents", {"file": small, "collection": hr.pk})
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_error"
    big = SimpleUploadedFile("big.txt", b"x" * (1024 * 1024 + 1))
    response = staff.post("/v1/documents", {"file": big, "collection": hr.pk})
    assert response.status_code == 413 and "1 MB" in response.json()["error"]["message"]
    exe = SimpleUploadedFile("tool.exe", b"MZ")
    response = staff.post("/v1/documents", {"file": exe, "collection": hr.pk})
    assert response.status_code == 400 and "unsupported" in response.json()["error"]["message"]
    response = staff.post("/v1/documents", {"file": small, "collection": 987654})
    assert response.status_code == 400
    assert not Document.objects.exists()


def test_members_list_and_read_only_documents_of_collections_they_may_read(member, hr):
    user, client = member
    secret = Collection.objects.create(name="Secret")
    visible = Document.objects.create(collection=hr, title="handbook.md", file="a.md")
    hidden = Document.objects.create(collection=secret, title="salaries.md", file="b.md")
    assert client.get("/v1/documents").json()["data"] == []
    hr.readers.add(user)
    listed = client.get("/v1/documents").json()["data"]
    assert [d["id"] for d in listed] == [visible.pk]
    assert client.get(f"/v1/documents/{hidden.pk}").status_code == 404
    assert client.delete(f"/v1/documents/{visible.pk}").status_code == 403
    assert Document.objects.filter(pk=visible.pk).exists()


def test_staff_delete_documents(staff, hr):
    document = Document.objects.create(collection=hr, title="old.md", file="old.md")
    response = staff.delete(f"/v1/documents/{document.pk}")
    assert response.json() == {"id": document.pk, "object": "document", "deleted": True}
    assert staff.delete(f"/v1/documents/{document.pk}").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_search_returns_chunks_with_scores_and_citations_within_the_users_rights(retriever):
    hr = Collection.objects.create(name="HR")
    ingest(add_document(hr, "handbook.md", HANDBOOK).pk, retriever)
    user = User.objects.create_user("member")
    client = client_for(user)
    body = {"query": "paid holiday", "top_k": 1}
    assert client.post("/v1/search", body, content_type="application/json").json()["data"] == []
    response = client.post(
        "/v1/search", {**body, "collections": ["HR"]}, content_type="application/json"
    )
    assert response.status_code == 403
    hr.readers.add(user)
    [hit] = client.post("/v1/search", body, content_type="application/json").json()["data"]
    assert hit["document_title"] == "handbook.md" and "thirty days" in hit["snippet"]
    assert (
        hit["n"] == 1
        and isinstance(hit["score"], float)
        and hit["url"].endswith(f"#chunk-{hit['chunk_id']}")
    )


def test_every_endpoint_wants_a_valid_key(hr):
    client = Client()
    for method, path in [("get", "/v1/documents"), ("get", "/v1/models"),
                         ("post", "/v1/search")]:  # fmt: skip
        response = getattr(client, method)(path)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
    bad = Client(headers={"Authorization": "Bearer ck-wrong"})
    assert bad.get("/v1/documents").status_code == 401


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("name", "build", "reason"),
    [
        ("bomb.docx", lambda: bad.docx_bomb(300), "may be a zip bomb"),
        ("bomb.pdf", lambda: bad.pdf_flate_bomb(300), "safety limit of the PDF reader"),
        ("forms.pdf", bad.pdf_form_bomb, "took longer than 2 s"),
        ("random.pdf", lambda: bytes(range(256)) * 16, "PDF is corrupt or unreadable"),
        ("text.docx", lambda: b"Just text, not a zip.", "not a .docx file"),
        ("blank.md", lambda: b"  \n\n  ", "only blanks"),
    ],
)
def test_hostile_uploads_are_accepted_then_end_failed_with_a_reason(
    retriever, settings, name, build, reason
):
    # NOTE: with tasks in-process (no Redis), ingestion runs when the upload commits, inside the
    # request: a hostile file must neither hang it nor turn it into a server error.
    settings.CACHET_EXTRACT_TIMEOUT_S = 2
    staff = client_for(User.objects.create_user("staff", is_staff=True))
    hr = Collection.objects.create(name="HR")
    upload = SimpleUploadedFile(name, build())
    with bad.time_limit(60):
        response = staff.post("/v1/documents", {"file": upload, "collection": hr.pk})
    assert response.status_code == 201, response.content
    status = staff.get(f"/v1/documents/{response.json()['id']}").json()
    assert status["status"] == "failed" and reason in status["error"], status


@pytest.mark.django_db(transaction=True)  # the upload's commit runs the in-process task
def test_an_internal_ingestion_failure_still_answers_201_and_marks_the_document_failed(
    retriever, monkeypatch
):
    # NOTE: fault injection: the embedding step breaks (as on a full disk or a corrupt model);
    # with tasks in-process the error surfaces inside the upload request.
    def broken_encode(texts):
        raise RuntimeError("embedding model unavailable")

    monkeypatch.setattr(retriever.embedder, "encode", broken_encode)
    staff = client_for(User.objects.create_user("staff", is_staff=True))
    hr = Collection.objects.create(name="HR")
    upload = SimpleUploadedFile("notes.md", b"# Notes\n\nKitchen cleaned on Fridays.")
    response = staff.post("/v1/documents", {"file": upload, "collection": hr.pk})
    assert response.status_code == 201, response.content
    status = staff.get(f"/v1/documents/{response.json()['id']}").json()
    assert status["status"] == "failed", status
    assert "embedding model unavailable" in status["error"], status


def test_an_empty_upload_is_refused_with_400(staff, hr, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    empty = SimpleUploadedFile("empty.pdf", b"")
    response = staff.post("/v1/documents", {"file": empty, "collection": hr.pk})
    assert response.status_code == 400 and "empty" in response.json()["error"]["message"]
    assert not Document.objects.exists()


def test_a_logged_in_session_without_a_key_is_refused(hr):
    # The API authenticates by key only, never by the session cookie, so a cross-site page
    # cannot make a logged-in browser call it (no CSRF exposure).
    client = Client()
    client.force_login(User.objects.create_user("staff", is_staff=True))
    upload = SimpleUploadedFile("a.txt", b"x")
    response = client.post("/v1/documents", {"file": upload, "collection": hr.pk})
    assert response.status_code == 401
    assert client.get("/v1/documents").status_code == 401
    assert not Document.objects.exists()


@pytest.mark.django_db(transaction=True)  # the upload's commit runs the in-process task
def test_a_failure_reason_stays_english_for_api_clients_unless_they_ask_for_chinese(retriever):
    staff = client_for(User.objects.create_user("staff", is_staff=True))
    hr = Collection.objects.create(name="HR")
    upload = SimpleUploadedFile("bomb.docx", bad.docx_bomb(300))
    response = staff.post("/v1/documents", {"file": upload, "collection": hr.pk})
    assert response.status_code == 201, response.content
    path = f"/v1/documents/{response.json()['id']}"
    english = staff.get(path).json()
    assert english["status"] == "failed"
    assert english["error"] == (
        "The Word file unpacks to 301 MB, more than the 100 MB a document may unpack to "
        "(CACHET_MAX_UNPACKED_MB); it may be a zip bomb."
    )
    chinese = staff.get(path, headers={"accept-language": "zh-CN"}).json()
    assert chinese["error"] == (
        "该 Word 文件解压后为 301 MB，超过了单个文档解压后 100 MB 的上限"  # noqa: RUF001
        "（CACHET_MAX_UNPACKED_MB）；它可能是 zip 炸弹。"  # noqa: RUF001
    )
    listed = staff.get("/v1/documents", headers={"accept-language": "zh-hans"}).json()
    assert listed["data"][0]["error"] == chinese["error"]
