"""Text extraction from uploaded files: txt, md, html, pdf (pypdf), docx (python-docx).

Each extractor returns `Section`s: a run of text with the page it came from (pdf) and the heading
path above it (md, html, docx), so chunks can cite where they came from.
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

SUFFIX_TO_MIME = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
SUPPORTED_SUFFIXES = tuple(SUFFIX_TO_MIME)
MARKDOWN_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


class ExtractionError(Exception):
    """The file cannot be turned into text; the message is shown to the user as is."""


@dataclass(slots=True)
class Section:
    text: str
    page: int | None = None
    heading_path: list[str] = field(default_factory=list)


def mime_type_for(filename: str) -> str:
    return SUFFIX_TO_MIME.get(Path(filename).suffix.lower(), "application/octet-stream")


def extract(data: bytes, filename: str) -> list[Section]:
    """Sections of text from a file's bytes; raises ExtractionError with a readable reason."""
    suffix = Path(filename).suffix.lower()
    if suffix not in SUFFIX_TO_MIME:
        supported = ", ".join(sorted({s.lstrip(".") for s in SUPPORTED_SUFFIXES}))
        raise ExtractionError(
            f"Unsupported file type {suffix or '(none)'!r}; supported: {supported}."
        )
    if not data:
        raise ExtractionError("The file is empty.")
    mime = SUFFIX_TO_MIME[suffix]
    if mime == "text/plain":
        sections = _paragraph_sections(_decode(data))
    elif mime == "text/markdown":
        sections = _markdown_sections(_decode(data))
    elif mime == "text/html":
        sections = _html_sections(data)
    elif mime == "application/pdf":
        sections = _pdf_sections(data)
    else:
        sections = _docx_sections(data)
    sections = [s for s in sections if s.text.strip()]
    if not sections:
        raise ExtractionError("No text could be extracted (an empty or image-only document).")
    return sections


def _decode(data: bytes) -> str:
    if b"\x00" in data[:4096]:
        raise ExtractionError("The file looks binary, not text.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        # NOTE: Windows-era text files are common in team shares; cp1252 decodes every byte.
        return data.decode("cp1252", errors="replace")


def _paragraph_sections(text: str, heading_path: list[str] | None = None) -> list[Section]:
    return [Section(text.strip(), None, list(heading_path or []))] if text.strip() else []


class SectionBuilder:
    """Collects text blocks into sections, each tagged with the headings above it."""

    def __init__(self, joiner: str = "\n\n") -> None:
        self.joiner = joiner
        self.sections: list[Section] = []
        self.headings: list[tuple[int, str]] = []  # (level, text), outermost first
        self.blocks: list[str] = []

    @property
    def heading_path(self) -> list[str]:
        return [text for _, text in self.headings]

    def add_text(self, text: str) -> None:
        self.blocks.append(text)

    def add_heading(self, level: int, text: str) -> None:
        """A heading ends the current section and replaces those at its level or below."""
        self.flush()
        self.headings = [(lvl, h) for lvl, h in self.headings if lvl < level]
        self.headings.append((level, text))

    def add_section(self, body: str) -> None:
        if body:
            self.sections.append(Section(body, None, self.heading_path))

    def flush(self) -> None:
        self.add_section(self.joiner.join(self.blocks).strip())
        self.blocks.clear()

    def finish(self) -> list[Section]:
        self.flush()
        return self.sections


def _markdown_sections(text: str) -> list[Section]:
    builder = SectionBuilder(joiner="\n")
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        match = None if in_code else MARKDOWN_HEADING.match(line)
        if match:
            builder.add_heading(len(match.group(1)), match.group(2))
        else:
            builder.add_text(line)
    return builder.finish()


def _html_sections(data: bytes) -> list[Section]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(data, "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "head"]):
        tag.decompose()
    builder = SectionBuilder()
    blocks = ["h1", "h2", "h3", "h4", "h5", "h6", "p", "li", "pre", "td", "th", "blockquote"]
    found = soup.find_all(blocks)
    if not found:
        return _paragraph_sections(soup.get_text("\n"))
    for element in found:
        if element.find_parent(["p", "li", "pre", "td", "th", "blockquote"]):
            continue  # NOTE: nested blocks are already in their parent's text.
        text = " ".join(element.get_text(" ").split())
        if not text:
            continue
        if element.name[0] == "h" and element.name[1:].isdigit():
            builder.add_heading(int(element.name[1:]), text)
        else:
            builder.add_text(text)
    return builder.finish()


def _pdf_sections(data: bytes) -> list[Section]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            # NOTE: many "encrypted" PDFs only restrict printing and open with the empty password.
            try:
                opened = reader.decrypt("")
            except Exception:
                opened = 0
            if not opened:
                raise ExtractionError("The PDF is encrypted with a password; upload it unlocked.")
        sections = []
        for number, page in enumerate(reader.pages, start=1):
            text = page.extract_text() or ""
            if text.strip():
                sections.append(Section(text.strip(), number, []))
        return sections
    except ExtractionError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, OSError) as error:
        logger.info("unreadable pdf: %s", error)
        raise ExtractionError(f"The PDF is corrupt or unreadable ({error}).") from None


def _docx_sections(data: bytes) -> list[Section]:
    import zipfile

    from docx import Document as DocxDocument
    from docx.opc.exceptions import PackageNotFoundError

    try:
        document = DocxDocument(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as error:
        raise ExtractionError(f"The Word file is corrupt or not a .docx file ({error}).") from None
    builder = SectionBuilder()
    for paragraph in document.paragraphs:
        text = paragraph.text.strip()
        if not text:
            continue
        style = (paragraph.style.name if paragraph.style is not None else "") or ""
        if style.startswith("Heading") and style[7:].strip().isdigit():
            builder.add_heading(int(style[7:].strip()), text)
        elif style == "Title":
            builder.add_heading(0, text)  # level 0: replaces every heading, as before
        else:
            builder.add_text(text)
    builder.flush()
    for table in document.tables:
        rows = [" | ".join(cell.text.strip() for cell in row.cells) for row in table.rows]
        builder.add_section("\n".join(r for r in rows if r.strip(" |")))
    return builder.sections
