"""chat.queue_views and chat.collection_views: the upload panel's and the ingestion queue's
endpoints. Staff only (members get 403, the anonymous 401), collections with their readers,
bulk uploads with a result per file, cancel and retry."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from django.contrib.auth.models import Group, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from retrieval.models import Chunk, Collection, Document
from tests.documents import KITCHEN, add_document

pytestmark = pytest.mark.django_db

STAFF_ENDPOINTS = [
    ("get", "/chat/api/documents/queue/"),
    ("post", "/chat/api/documents/bulk/"),
    ("post", "/chat/api/documents/1/cancel/"),
    ("post", "/chat/api/documents/1/retry/"),
    ("post", "/chat/api/collections/"),
]


@pytest.fixture
def staff_client(settings, tmp_path) -> Client:
    settings.MEDIA_ROOT = tmp_path / "media"
    client = Client()
    client.force_login(User.objects.create_user("carol", is_staff=True))
    return client


def post_json(client: Client, path: str, body: object):
    return client.post(path, json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(("method", "path"), STAFF_ENDPOINTS)
def test_members_get_403_and_the_anonymous_401_from_every_staff_endpoint(method, path):
    Document.objects.create(
        collection=Collection.objects.create(name="HR"), title="secret.md", file="x.md"
    )
    member = Client()
    member.force_login(User.objects.create_user("alice"))
    response = getattr(member, method)(path)
    assert response.status_code == 403
    assert "secret.md" not in response.content.decode()
    assert getattr(Client(), method)(path).status_code == 401


def test_members_are_offered_no_upload_and_no_names():
    User.objects.create_user("bob")
    Group.objects.create(name="Engineering")
    member = Client()
    member.force_login(User.objects.create_user("alice"))
    upload = member.get("/chat/api/options/").json()["upload"]
    assert upload["allowed"] is False
    assert "readers" not in upload and "reader_groups" not in upload


def test_a_first_run_offers_general_and_staff_create_it_with_readers(staff_client):
    alice = User.objects.create_user("alice")
    User.objects.create_user("dora", is_staff=True)
    engineering = Group.objects.create(name="Engineering")
    upload = staff_client.get("/chat/api/options/").json()["upload"]
    assert upload["collections"] == [] and upload["first_collection_name"] == "General"
    assert [u["username"] for u in upload["readers"]] == ["alice"]  # staff read everything
    assert upload["reader_groups"] == [{"id": engineering.pk, "name": "Engineering"}]

    body = {"name": "  General ", "readers": [alice.pk], "reader_groups": [engineering.pk]}
    response = post_json(staff_client, "/chat/api/collections/", body)
    assert response.status_code == 201, response.content
    collection = Collection.objects.get(pk=response.json()["collection"]["id"])
    assert collection.name == "General"
    assert list(collection.readers.all()) == [alice]
    assert list(collection.reader_groups.all()) == [engineering]
    upload = staff_client.get("/chat/api/options/").json()["upload"]
    assert upload["first_collection_name"] == ""
    assert upload["collections"] == [{"id": collection.pk, "name": "General"}]


def test_a_taken_name_an_unknown_reader_or_bad_json_changes_nothing(staff_client):
    Collection.objects.create(name="General")
    taken = post_json(staff_client, "/chat/api/collections/", {"name": "General"})
    assert taken.status_code == 400 and "already exists" in taken.json()["error"]["message"]
    unknown = post_json(staff_client, "/chat/api/collections/", {"name": "HR", "readers": [999]})
    assert unknown.status_code == 400
    empty = post_json(staff_client, "/chat/api/collections/", {"name": "   "})
    assert empty.status_code == 400
    bad = staff_client.post("/chat/api/collections/", "[", content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_json"
    assert list(Collection.objects.values_list("name", flat=True)) == ["General"]


def zip_upload(name: str, members: dict[str, bytes]) -> SimpleUploadedFile:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return SimpleUploadedFile(name, buffer.getvalue())


def test_a_bulk_upload_of_a_folder_and_a_zip_reports_each_file(staff_client):
    collection = Collection.objects.create(name="HR")
    files = [
        SimpleUploadedFile("leave.md", b"# Leave\nThirty days."),
        SimpleUploadedFile("logo.png", b"\x89PNG"),
        zip_upload("policies.zip", {"travel.txt": b"Trains.", "../evil.md": b"x"}),
    ]
    paths = ["handbook/leave.md", "handbook/logo.png", "handbook/policies.zip"]
    response = staff_client.post(
        "/chat/api/documents/bulk/",
        {"collection": collection.pk, "file": files, "path": paths},
    )
    assert response.status_code == 201, response.content
    results = {r["name"]: r for r in response.json()["results"]}
    assert list(results) == [
        "handbook/leave.md",
        "handbook/logo.png",
        "handbook/policies.zip/travel.txt",
        "handbook/policies.zip/../evil.md",
    ]
    assert results["handbook/leave.md"]["document"]["status"] == "queued"
    assert results["handbook/policies.zip/travel.txt"]["document"]["title"] == "travel.txt"
    assert "unsupported type" in results["handbook/logo.png"]["skipped"]
    assert "unsafe path" in results["handbook/policies.zip/../evil.md"]["skipped"]
    titles = sorted(Document.objects.values_list("title", flat=True))
    assert titles == ["leave.md", "travel.txt"]
    assert Document.objects.get(title="travel.txt").file.read() == b"Trains."


def test_a_bulk_upload_without_a_collection_or_files_is_refused(staff_client):
    collection = Collection.objects.create(name="HR")
    no_collection = staff_client.post(
        "/chat/api/documents/bulk/", {"file": [SimpleUploadedFile("a.md", b"a")]}
    )
    assert no_collection.status_code == 400
    no_files = staff_client.post("/chat/api/documents/bulk/", {"collection": collection.pk})
    assert no_files.status_code == 400
    nothing_usable = staff_client.post(
        "/chat/api/documents/bulk/",
        {"collection": collection.pk, "file": [SimpleUploadedFile("a.exe", b"MZ")]},
    )
    assert nothing_usable.status_code == 200
    assert "unsupported" in nothing_usable.json()["results"][0]["skipped"]
    assert not Document.objects.exists()


def test_the_queue_lists_every_document_newest_first_with_its_state(staff_client):
    collection = Collection.objects.create(name="HR")
    first = add_document(collection, "a.md", "a")
    second = add_document(collection, "b.md", "b")
    Document.objects.filter(pk=first.pk).update(status="failed", error="broken")
    rows = staff_client.get("/chat/api/documents/queue/").json()["documents"]
    assert [r["id"] for r in rows] == [second.pk, first.pk]
    assert rows[1]["status"] == "failed" and rows[1]["error"] == "broken"
    assert rows[0]["collection"] == {"id": collection.pk, "name": "HR"}


def test_cancel_answers_with_the_cancelled_document_and_409_once_it_is_ready(staff_client):
    document = add_document(Collection.objects.create(name="HR"), "a.md", "a")
    response = staff_client.post(f"/chat/api/documents/{document.pk}/cancel/")
    assert response.status_code == 200 and response.json()["document"]["status"] == "cancelled"
    again = staff_client.post(f"/chat/api/documents/{document.pk}/cancel/")
    assert again.status_code == 200  # a second click changes nothing
    Document.objects.filter(pk=document.pk).update(status="ready")
    done = staff_client.post(f"/chat/api/documents/{document.pk}/cancel/")
    assert done.status_code == 409 and done.json()["error"]["code"] == "not_cancellable"
    assert "Ready" in done.json()["error"]["message"]
    assert staff_client.post("/chat/api/documents/999/cancel/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_retry_ingests_a_failed_document_again_from_its_stored_file(retriever):
    staff = Client()
    staff.force_login(User.objects.create_user("carol", is_staff=True))
    document = add_document(Collection.objects.create(name="HR"), "kitchen.md", KITCHEN)
    Document.objects.filter(pk=document.pk).update(status="failed", error="the worker died")
    # NOTE: tasks in-process: the retry's ingestion runs inside the request when it commits.
    response = staff.post(f"/chat/api/documents/{document.pk}/retry/")
    assert response.status_code == 202, response.content
    document.refresh_from_db()
    assert document.status == "ready" and Chunk.objects.filter(document=document).count() == 1
    ready = staff.post(f"/chat/api/documents/{document.pk}/retry/")
    assert ready.status_code == 409 and ready.json()["error"]["code"] == "not_retryable"


def test_retry_of_a_document_whose_file_is_gone_says_so(staff_client):
    document = add_document(Collection.objects.create(name="HR"), "a.md", "a")
    document.file.delete(save=False)
    Document.objects.filter(pk=document.pk).update(status="cancelled")
    response = staff_client.post(f"/chat/api/documents/{document.pk}/retry/")
    assert response.status_code == 409 and response.json()["error"]["code"] == "file_missing"


# ---- failure reasons in the language of the page ----

QUEUE = "/chat/api/documents/queue/"
# Bytes that read as no known text encoding (retrieval.text_encoding refuses them).
NO_KNOWN_ENCODING = bytes(range(0x80, 0x100)) * 8
ENCODING_EN = (
    "The text's encoding could not be recognised (tried UTF-8, GB18030, Big5, Shift-JIS, EUC-KR, "
    "Windows-1252); save the file as UTF-8 and upload it again."
)
ENCODING_ZH = (
    "无法识别文本的编码（已尝试 UTF-8、GB18030、Big5、Shift-JIS、EUC-KR、Windows-1252）；"  # noqa: RUF001
    "请将文件另存为 UTF-8 后重新上传。"
)


@pytest.mark.django_db(transaction=True)  # the upload's commit runs the in-process ingestion
def test_a_failed_uploads_reason_is_stored_once_and_shown_in_each_viewers_language(
    retriever, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    carol = Client()
    carol.force_login(User.objects.create_user("carol", is_staff=True))
    collection = Collection.objects.create(name="HR")
    upload = SimpleUploadedFile("notes.txt", NO_KNOWN_ENCODING)
    response = carol.post(
        "/chat/api/documents/bulk/", {"collection": collection.pk, "file": upload}
    )
    assert response.status_code == 201, response.content
    document = Document.objects.get(title="notes.txt")
    assert document.status == "failed"
    # Stored in no language: the message id and its values; `error` keeps the English.
    assert document.error == ENCODING_EN
    assert document.error_reason == {"message": ENCODING_EN, "params": {}}
    chinese = carol.get(QUEUE, headers={"accept-language": "zh-CN,zh;q=0.9"}).json()
    assert chinese["documents"][0]["error"] == ENCODING_ZH
    english = carol.get(QUEUE, headers={"accept-language": "en-US"}).json()
    assert english["documents"][0]["error"] == ENCODING_EN
    carol.post("/i18n/setlang/", {"language": "zh-hans"})  # the page's language switch
    switched = carol.get(QUEUE, headers={"accept-language": "en-US"}).json()
    assert switched["documents"][0]["error"] == ENCODING_ZH


def test_a_reason_stored_before_reasons_had_no_language_is_still_shown(staff_client):
    collection = Collection.objects.create(name="HR")
    known = add_document(collection, "a.md", "")
    unknown = add_document(collection, "b.md", "b")
    # Rows failed by an older release: English text, no message id.
    Document.objects.filter(pk=known.pk).update(status="failed", error="The file is empty.")
    Document.objects.filter(pk=unknown.pk).update(status="failed", error="Disk on fire (EIO).")
    rows = staff_client.get(QUEUE, headers={"accept-language": "zh-hans"}).json()["documents"]
    errors = {row["title"]: row["error"] for row in rows}
    assert errors == {"a.md": "文件是空的。", "b.md": "Disk on fire (EIO)."}
