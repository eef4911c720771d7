"""retrieval.cited_text: a document's text rebuilt from its real chunks, the cited span marked."""

from __future__ import annotations

import itertools
import re

import pytest

from retrieval.chunking import SECTION_SEPARATOR
from retrieval.cited_text import CitedText, cited_text
from retrieval.extract import extract
from retrieval.ingest import ingest
from retrieval.models import Chunk, Collection, Document
from tests.documents import HANDBOOK, add_document
from tests.retrieval.test_extract import make_pdf

pytestmark = pytest.mark.django_db

# Paragraphs long enough that 24-token chunks overlap (chunking.py carries units over).
POLICY = "\n\n".join(
    f"Rule {n}. Staff member {n} files the travel report within {n + 2} days. "
    f"Receipts older than {n * 10} days are refused by the finance office."
    for n in range(1, 9)
)


def plain(text: CitedText) -> str:
    return SECTION_SEPARATOR.join(
        "".join(piece.text for run in block.runs for piece in run.pieces) for block in text.blocks
    )


def marked(text: CitedText) -> list[str]:
    return [
        "".join(piece.text for piece in run.pieces)
        for block in text.blocks
        for run in block.runs
        if run.is_cited
    ]


def squeeze(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.fixture
def small_chunks(settings):
    settings.CACHET_CHUNK_TOKENS = 24
    settings.CACHET_CHUNK_OVERLAP = 8


def test_overlapping_chunks_give_back_the_text_once_and_each_cited_span_exactly(
    retriever, small_chunks
) -> None:
    document = add_document(Collection.objects.create(name="hr"), "policy.txt", POLICY)
    ingest(document.pk, retriever)
    chunks = list(document.chunks.order_by("ordinal"))
    overlapping = [b for a, b in itertools.pairwise(chunks) if b.char_start < a.char_end]
    assert overlapping, "the test needs chunks that overlap"

    assert squeeze(plain(cited_text(document))) == squeeze(POLICY)
    assert marked(cited_text(document)) == []
    for chunk in chunks:
        text = cited_text(document, chunk.pk)
        assert marked(text) == [chunk.text]
        assert squeeze(plain(text)) == squeeze(POLICY)  # marking adds and loses nothing
        assert text.cited == chunk


def test_every_chunk_is_anchored_where_it_starts(retriever, small_chunks) -> None:
    document = add_document(Collection.objects.create(name="hr"), "policy.txt", POLICY)
    ingest(document.pk, retriever)
    anchors = [
        piece.anchor_chunk_id
        for block in cited_text(document).blocks
        for run in block.runs
        for piece in run.pieces
        if piece.anchor_chunk_id is not None
    ]
    assert anchors == list(document.chunks.order_by("ordinal").values_list("id", flat=True))


def test_headings_and_pdf_pages_start_blocks_and_the_cited_page_is_marked(retriever) -> None:
    collection = Collection.objects.create(name="hr")
    handbook = add_document(collection, "handbook.md", HANDBOOK)
    ingest(handbook.pk, retriever)
    blocks = cited_text(handbook).blocks
    assert [block.heading_path for block in blocks] == [
        ["Handbook", "Leave"],
        ["Handbook", "Travel"],
    ]
    sections = extract(HANDBOOK.encode(), "handbook.md")
    assert plain(cited_text(handbook)) == SECTION_SEPARATOR.join(s.text for s in sections)

    pages = ["Opening hours are nine to five.", "The archive is on the second floor."]
    manual = add_document(collection, "manual.pdf", make_pdf(pages))
    ingest(manual.pk, retriever)
    second = manual.chunks.get(page=2)
    text = cited_text(manual, second.pk)
    assert [block.page for block in text.blocks] == [1, 2]
    assert [run.is_cited for run in text.blocks[0].runs] == [False]
    assert marked(text) == [second.text] and "second floor" in second.text


def test_a_chunk_of_another_document_marks_nothing(retriever) -> None:
    collection = Collection.objects.create(name="hr")
    handbook = add_document(collection, "handbook.md", HANDBOOK)
    other = add_document(collection, "other.md", "# Other\nA different text altogether.\n")
    ingest(handbook.pk, retriever)
    ingest(other.pk, retriever)
    text = cited_text(handbook, other.chunks.get().pk)
    assert text.cited is None and marked(text) == []
    assert "thirty days" in plain(text)


def test_a_chunk_whose_span_does_not_fit_its_text_is_shown_whole() -> None:
    collection = Collection.objects.create(name="hr")
    document = Document.objects.create(collection=collection, title="odd.md", file="odd.md")
    first = Chunk.objects.create(
        document=document, ordinal=0, text="Thirty days.", token_count=3, char_start=0,
        char_end=12,
    )  # fmt: skip
    odd = Chunk.objects.create(
        document=document, ordinal=1, text="Written by hand.", token_count=3, char_start=5,
        char_end=7,
    )  # fmt: skip
    text = cited_text(document, odd.pk)
    assert plain(text) == "Thirty days.Written by hand."
    assert marked(text) == ["Written by hand."]
    assert marked(cited_text(document, first.pk)) == ["Thirty days."]
