"""retrieval.ingest: read, extract, chunk, embed, store and index one document, idempotently."""

from __future__ import annotations

import pytest
from django.core.files.base import ContentFile

from retrieval.ingest import ingest
from retrieval.models import Chunk, Collection, Document
from retrieval.search import search
from tests import malicious_files as bad
from tests.documents import HANDBOOK, KITCHEN, add_document

pytestmark = pytest.mark.django_db


def test_ingesting_twice_leaves_the_same_chunks_and_vectors(retriever) -> None:
    collection = Collection.objects.create(name="hr")
    document = add_document(collection, "handbook.md", HANDBOOK)
    ingest(document.pk, retriever)
    first = list(Chunk.objects.filter(document=document).values_list("ordinal", "text"))
    first_vectors = retriever.vectors.ids()
    ingest(document.pk, retriever)
    assert list(Chunk.objects.filter(document=document).values_list("ordinal", "text")) == first
    assert retriever.vectors.ids() == set(Chunk.objects.values_list("id", flat=True))
    assert len(retriever.vectors) == len(first)
    assert not first_vectors & retriever.vectors.ids()  # the old vectors went with their chunks


def test_a_broken_file_fails_with_a_reason_and_leaves_others_searchable(retriever) -> None:
    collection = Collection.objects.create(name="mixed")
    good = add_document(collection, "kitchen.txt", KITCHEN)
    bad = add_document(collection, "broken.pdf", b"%PDF-1.4 garbage")
    ingest(good.pk, retriever)
    ingest(bad.pk, retriever)
    bad.refresh_from_db()
    assert bad.status == Document.Status.FAILED and "corrupt" in bad.error
    assert search("kitchen cleaning", top_k=1)[0].document_title == "kitchen.txt"


def test_a_document_that_turns_bad_on_reingest_loses_its_old_chunks_and_vectors(
    retriever,
) -> None:
    document = add_document(Collection.objects.create(name="c"), "notes.txt", KITCHEN)
    ingest(document.pk, retriever)
    assert retriever.vectors.ids()
    document.file.delete(save=False)
    document.file.save("notes.txt", ContentFile(b""), save=True)
    ingest(document.pk, retriever)
    document.refresh_from_db()
    assert document.status == Document.Status.FAILED and "empty" in document.error
    assert not Chunk.objects.filter(document=document).exists()
    assert retriever.vectors.ids() == set()


def test_a_file_over_the_upload_limit_fails_with_the_limit_in_the_reason(
    retriever, settings
) -> None:
    settings.CACHET_MAX_UPLOAD_MB = 1
    document = add_document(Collection.objects.create(name="c"), "big.txt", "a " * 600_000)
    ingest(document.pk, retriever)
    document.refresh_from_db()
    assert document.status == Document.Status.FAILED and "1 MB" in document.error


def test_a_missing_document_is_nothing_to_do(retriever) -> None:
    assert ingest(987_654, retriever) is None


HOSTILE_UPLOADS = [
    ("bomb.docx", lambda: bad.docx_bomb(300), "may be a zip bomb"),
    ("bomb.pdf", lambda: bad.pdf_flate_bomb(300), "safety limit of the PDF reader"),
    ("pages.pdf", lambda: bad.pdf_pages(6000), "more than the 5000 pages"),
    ("forms.pdf", bad.pdf_form_bomb, "took longer than 2 s"),
    ("text.pdf", lambda: b"Just text, not a PDF.", "PDF is corrupt or unreadable"),
    ("random.pdf", lambda: bytes(range(256)) * 16, "PDF is corrupt or unreadable"),
    ("text.docx", lambda: b"Just text, not a zip.", "not a .docx file"),
    ("empty.pdf", lambda: b"", "The file is empty"),
    ("blank.docx", lambda: b" \n\n ", "only blanks"),
    ("scripts.html", lambda: b"<script>alert(1)</script><style>p{}</style>", "No text"),
]


@pytest.mark.parametrize(("name", "build", "reason"), HOSTILE_UPLOADS)
def test_hostile_files_end_failed_with_a_reason_in_bounded_time_and_leave_others_searchable(
    retriever, settings, name, build, reason
) -> None:
    settings.CACHET_EXTRACT_TIMEOUT_S = 2
    collection = Collection.objects.create(name="mixed")
    good = add_document(collection, "kitchen.txt", KITCHEN)
    ingest(good.pk, retriever)
    hostile = add_document(collection, name, build())
    with bad.time_limit(30):
        ingest(hostile.pk, retriever)
    hostile.refresh_from_db()
    assert hostile.status == Document.Status.FAILED and reason in hostile.error, hostile.error
    assert not Chunk.objects.filter(document=hostile).exists()
    assert [hit.document_title for hit in search("kitchen cleaning", top_k=5)] == ["kitchen.txt"]
