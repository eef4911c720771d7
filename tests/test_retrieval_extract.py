"""retrieval.extract: text and its place (page, heading path) out of each supported file type."""

from __future__ import annotations

import io

import pytest
from docx import Document as DocxDocument
from pypdf import PdfReader, PdfWriter

from retrieval.extract import ExtractionError, extract


def make_pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF with one text line per page (built by hand; pypdf cannot add text)."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", ""]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
        page_number = len(objects) + 1
        kids.append(f"{page_number} 0 R")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {page_number + 1} 0 R"
            " /Resources << /Font << /F1 << /Type /Font /Subtype /Type1"
            " /BaseFont /Helvetica >> >> >> >>"
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(pages)} >>"
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n{body}\nendobj\n".encode())
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return out.getvalue()


def encrypt_pdf(data: bytes, password: str) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.encrypt(password, algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def make_docx() -> bytes:
    document = DocxDocument()
    document.add_heading("Handbook", level=1)
    document.add_heading("Leave", level=2)
    document.add_paragraph("Staff get thirty days of paid leave.")
    document.add_heading("Travel", level=2)
    document.add_paragraph("Book trains, not planes, under 600 km.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_plain_text_is_extracted_as_one_section() -> None:
    sections = extract(b"First paragraph.\n\nSecond one.", "notes.txt")
    assert [s.text for s in sections] == ["First paragraph.\n\nSecond one."]


def test_markdown_sections_keep_their_heading_path() -> None:
    text = "# Guide\nIntro.\n## Install\nRun make.\n## Use\nOpen it.\n```\n# not a heading\n```"
    sections = extract(text.encode(), "guide.md")
    assert [(s.heading_path, s.text.splitlines()[0]) for s in sections] == [
        (["Guide"], "Intro."),
        (["Guide", "Install"], "Run make."),
        (["Guide", "Use"], "Open it."),
    ]
    assert "# not a heading" in sections[-1].text


def test_html_drops_scripts_and_keeps_headings() -> None:
    html = (
        b"<html><head><title>t</title><script>var x=1</script></head><body><h1>Policy</h1>"
        b"<p>Be kind.</p><h2>Details</h2><p>Always.</p></body></html>"
    )
    sections = extract(html, "policy.html")
    assert [(s.heading_path, s.text) for s in sections] == [
        (["Policy"], "Be kind."),
        (["Policy", "Details"], "Always."),
    ]


def test_pdf_text_comes_with_page_numbers() -> None:
    sections = extract(make_pdf(["Alpha page text", "Beta page text"]), "report.pdf")
    assert [(s.page, s.text) for s in sections] == [(1, "Alpha page text"), (2, "Beta page text")]


def test_docx_paragraphs_keep_their_heading_path() -> None:
    sections = extract(make_docx(), "handbook.docx")
    assert [(s.heading_path, s.text) for s in sections] == [
        (["Handbook", "Leave"], "Staff get thirty days of paid leave."),
        (["Handbook", "Travel"], "Book trains, not planes, under 600 km."),
    ]


@pytest.mark.parametrize(
    ("data", "name", "reason"),
    [
        (b"", "empty.txt", "empty"),
        (b"MZ\x90\x00binary", "tool.exe", "Unsupported file type"),
        (b"%PDF-1.4 this is not really a pdf", "broken.pdf", "corrupt"),
        (b"PK\x03\x04 not a zip", "broken.docx", "corrupt"),
        (b"\x00\x01\x02binary", "fake.txt", "binary"),
        (b"   \n\n  ", "blank.md", "No text"),
    ],
)
def test_unusable_files_raise_a_readable_reason(data: bytes, name: str, reason: str) -> None:
    with pytest.raises(ExtractionError, match=reason):
        extract(data, name)


def test_password_protected_pdf_is_refused_with_a_readable_reason() -> None:
    with pytest.raises(ExtractionError, match="encrypted"):
        extract(encrypt_pdf(make_pdf(["secret"]), "hunter2"), "locked.pdf")
