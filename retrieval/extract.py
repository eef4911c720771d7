"""Text extraction from uploaded files: txt, md, html (lxml), pdf (pypdf), docx (python-docx).

Each extractor returns `Section`s: a run of text with the page it came from (pdf) and the heading
path above it (md, html, docx), so chunks can cite where they came from.

Uploads are untrusted: every file's work is bounded (`Limits`, from the settings). A .docx may
unzip to at most `CACHET_MAX_UNPACKED_MB`, a PDF have at most `CACHET_MAX_PDF_PAGES` pages (pypdf
bounds each stream's inflation and parsing itself), and extraction stops after
`CACHET_EXTRACT_TIMEOUT_S` seconds, checked while PDF operators, docx paragraphs and HTML chunks
are processed. HTML is parsed as a stream, never as a tree, so memory follows the text, not the
markup. Whatever a parser raises on a malformed file becomes an `ExtractionError`.
"""

from __future__ import annotations

import io
import logging
import re
import struct
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from django.utils.translation import gettext_noop

from retrieval.reasons import Reason, Value
from retrieval.text_encoding import UnknownEncodingError, decode_text, has_utf16_bom

if TYPE_CHECKING:
    from docx.document import Document as DocxDocumentType

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


MB = 1024 * 1024
MAX_DOCX_PARTS = 10_000  # a real .docx has tens to hundreds; each costs memory when opened
HTML_FEED_BYTES = 1 * MB
# A page's own encoding: <meta charset=...> or <meta http-equiv=... content="...; charset=...">,
# which HTML puts in the first 1,024 bytes (looked for a little further).
HTML_CHARSET = re.compile(rb"<meta[^>]*charset\s*=", re.IGNORECASE)
HTML_CHARSET_PREFIX = 4096


class ExtractionError(Exception):
    """The file cannot be turned into text, and why: `reason`, an English message id (marked with
    `gettext_noop`) and its values, shown to each user in their language; str() is the English."""

    def __init__(self, message: str, **params: Value) -> None:
        self.reason = Reason(message, params)
        super().__init__(self.reason.english())


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on the work one file may cause; a file beyond them fails with a readable reason."""

    timeout_s: float = 300.0
    max_unpacked_bytes: int = 100 * MB
    max_pdf_pages: int = 5000

    @classmethod
    def from_settings(cls) -> Limits:
        from django.conf import settings

        return cls(
            timeout_s=settings.CACHET_EXTRACT_TIMEOUT_S,
            max_unpacked_bytes=settings.CACHET_MAX_UNPACKED_MB * MB,
            max_pdf_pages=settings.CACHET_MAX_PDF_PAGES,
        )


class Deadline:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s

    def check(self, *_: object) -> None:
        """Raises once the time is up; also a pypdf operator visitor, hence the ignored args."""
        if time.monotonic() > self.at:
            raise ExtractionError(
                gettext_noop(
                    "Extracting the text took longer than %(seconds)s s; the file is too large "
                    "or too complex to index (split it, or raise CACHET_EXTRACT_TIMEOUT_S)."
                ),
                seconds=f"{self.timeout_s:g}",
            )


@dataclass(slots=True)
class Section:
    text: str
    page: int | None = None
    heading_path: list[str] = field(default_factory=list)


def mime_type_for(filename: str) -> str:
    return SUFFIX_TO_MIME.get(Path(filename).suffix.lower(), "application/octet-stream")


def extract(data: bytes, filename: str, limits: Limits | None = None) -> list[Section]:
    """Sections of text from a file's bytes; raises ExtractionError with a readable reason.

    `limits`: None reads them from the settings.
    """
    limits = limits or Limits.from_settings()
    deadline = Deadline(limits.timeout_s)
    suffix = Path(filename).suffix.lower()
    if suffix not in SUFFIX_TO_MIME:
        supported = ", ".join(sorted({s.lstrip(".") for s in SUPPORTED_SUFFIXES}))
        raise ExtractionError(
            gettext_noop("Unsupported file type %(suffix)s; supported: %(supported)s."),
            suffix=repr(suffix or "(none)"),
            supported=supported,
        )
    if not data:
        raise ExtractionError(gettext_noop("The file is empty."))
    if data.isspace():
        raise ExtractionError(gettext_noop("The file holds only blanks."))
    mime = SUFFIX_TO_MIME[suffix]
    if mime == "text/plain":
        sections = _paragraph_sections(_decode(data))
    elif mime == "text/markdown":
        sections = _markdown_sections(_decode(data))
    elif mime == "text/html":
        sections = _html_sections(data, deadline)
    elif mime == "application/pdf":
        sections = _pdf_sections(data, limits, deadline)
    else:
        sections = _docx_sections(data, limits, deadline)
    sections = [s for s in sections if s.text.strip()]
    if not sections:
        raise ExtractionError(
            gettext_noop("No text could be extracted (an empty or image-only document).")
        )
    return sections


def _decode(data: bytes) -> str:
    if b"\x00" in data[:4096] and not has_utf16_bom(data):
        raise ExtractionError(gettext_noop("The file looks binary, not text."))
    try:
        return decode_text(data)
    except UnknownEncodingError as error:
        raise ExtractionError(error.message) from None


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


HTML_SKIPPED = frozenset({"script", "style", "noscript", "template", "head"})
HTML_BLOCKS = frozenset(
    {"h1", "h2", "h3", "h4", "h5", "h6", "p", "li", "pre", "td", "th", "blockquote"}
)


class _HtmlTarget:
    """lxml parser target: the text of each outermost block element, and the headings.

    Works on parse events, never building a tree: a page of millions of tiny elements costs
    memory for its text only. A block nested in another block is part of the outer one's text.
    """

    def __init__(self) -> None:
        self.builder = SectionBuilder()
        self.depth = 0
        self.skipped_at: int | None = None  # depth of the open script/style/... element
        self.block: tuple[str, int] | None = None  # (tag, depth) of the open outermost block
        self.block_parts: list[str] = []
        self.found_block = False
        self.all_text: list[str] = []  # for a page without any block element

    def start(self, tag: object, attrib: object) -> None:
        self.depth += 1
        tag = tag.lower() if isinstance(tag, str) else ""
        if self.skipped_at is not None:
            return
        if tag in HTML_SKIPPED:
            self.skipped_at = self.depth
        elif self.block is None and tag in HTML_BLOCKS:
            self.block = (tag, self.depth)
            if not self.found_block:
                self.found_block = True
                self.all_text.clear()
        else:
            self._boundary()

    def end(self, tag: object) -> None:
        if self.skipped_at == self.depth:
            self.skipped_at = None
        elif self.block is not None and self.block[1] == self.depth:
            self._end_block()
        elif self.skipped_at is None:
            self._boundary()
        self.depth -= 1

    def data(self, text: str) -> None:
        # NOTE: lxml splits a text run at entities; the pieces are joined without a separator.
        if self.skipped_at is not None:
            return
        if self.block is not None:
            self.block_parts.append(text)
        elif not self.found_block:
            self.all_text.append(text)

    def _boundary(self) -> None:
        """An element starts or ends: words on either side are separate words."""
        if self.block is not None:
            self.block_parts.append(" ")
        elif not self.found_block:
            self.all_text.append("\n")

    def close(self) -> list[Section]:
        if self.block is not None:
            self._end_block()
        if not self.found_block:
            return _paragraph_sections("".join(self.all_text))
        return self.builder.finish()

    def _end_block(self) -> None:
        if self.block is None:
            return
        tag = self.block[0]
        text = " ".join("".join(self.block_parts).split())
        self.block, self.block_parts = None, []
        if not text:
            return
        if tag[0] == "h" and tag[1:].isdigit():
            self.builder.add_heading(int(tag[1:]), text)
        else:
            self.builder.add_text(text)


def _html_sections(data: bytes, deadline: Deadline) -> list[Section]:
    from lxml import etree

    if b"\x00" in data[:4096]:
        raise ExtractionError(gettext_noop("The file looks binary, not HTML."))
    source: str | bytes
    try:
        source = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        # lxml honours the page's own <meta charset>. NOTE: without one it would read latin-1,
        # storing GB18030 or Big5 pages as mojibake: detected like a text upload instead.
        declared = HTML_CHARSET.search(data[:HTML_CHARSET_PREFIX])
        source = data if declared else _decode(data)
    parser = etree.HTMLParser(target=_HtmlTarget(), no_network=True)
    try:
        for start in range(0, len(source), HTML_FEED_BYTES):
            parser.feed(source[start : start + HTML_FEED_BYTES])
            deadline.check()
        sections: list[Section] = parser.close()
        return sections
    except etree.LxmlError as error:
        raise ExtractionError(
            gettext_noop("The HTML file is unreadable (%(error)s)."), error=str(error)
        ) from None


PDF_READER_ERRORS = (
    ValueError, KeyError, TypeError, AttributeError, IndexError, OSError, RecursionError,
    ZeroDivisionError, AssertionError, struct.error, zlib.error,
)  # fmt: skip


def _pdf_sections(data: bytes, limits: Limits, deadline: Deadline) -> list[Section]:
    from pypdf import PdfReader
    from pypdf.errors import LimitReachedError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            # NOTE: many "encrypted" PDFs only restrict printing and open with the empty password.
            try:
                opened = bool(reader.decrypt(""))
            except Exception:
                opened = False
            if not opened:
                raise ExtractionError(
                    gettext_noop("The PDF is encrypted with a password; upload it unlocked.")
                )
        num_pages = len(reader.pages)
        if num_pages > limits.max_pdf_pages:
            raise ExtractionError(
                gettext_noop(
                    "The PDF has %(pages)s pages, more than the %(limit)s pages a "
                    "document may have (CACHET_MAX_PDF_PAGES); split it."
                ),
                pages=num_pages,
                limit=limits.max_pdf_pages,
            )
        sections = []
        for number, page in enumerate(reader.pages, start=1):
            deadline.check()
            # NOTE: the visitor checks the deadline between operators, so one page whose forms
            # are drawn thousands of times cannot run for hours.
            text = page.extract_text(visitor_operand_before=deadline.check) or ""
            if text.strip():
                sections.append(Section(text.strip(), number, []))
        return sections
    except ExtractionError:
        raise
    except LimitReachedError as error:
        logger.info("pdf beyond pypdf's limits: %s", error)
        raise ExtractionError(
            gettext_noop(
                "The PDF exceeds a safety limit of the PDF reader (%(error)s); it may be "
                "malformed or built to exhaust the server."
            ),
            error=str(error),
        ) from None
    except (PyPdfError, *PDF_READER_ERRORS) as error:
        logger.info("unreadable pdf: %r", error)
        raise ExtractionError(
            gettext_noop("The PDF is corrupt or unreadable (%(error)s)."), error=str(error)
        ) from None


def _check_docx_size(data: bytes, limits: Limits) -> None:
    """Refuse a zip bomb before python-docx unpacks it.

    Python's zipfile never inflates a member beyond its declared size (a lie fails its CRC
    check), so the declared sizes bound what opening the package can cost.
    """
    # NOTE: counts central-directory signatures before zipfile parses every entry into memory.
    if data.count(b"PK\x01\x02") > MAX_DOCX_PARTS:
        raise ExtractionError(
            gettext_noop("The Word file has more than %(limit)s parts; it is not a real document."),
            limit=MAX_DOCX_PARTS,
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as error:
        raise _not_docx(error) from None
    if unpacked > limits.max_unpacked_bytes:
        raise ExtractionError(
            gettext_noop(
                "The Word file unpacks to %(size)s MB, more than the %(limit)s MB a document may "
                "unpack to (CACHET_MAX_UNPACKED_MB); it may be a zip bomb."
            ),
            size=f"{unpacked / MB:.0f}",
            limit=f"{limits.max_unpacked_bytes / MB:.0f}",
        )


def _not_docx(error: Exception) -> ExtractionError:
    return ExtractionError(
        gettext_noop("The Word file is corrupt or not a .docx file (%(error)s)."), error=str(error)
    )


def _docx_sections(data: bytes, limits: Limits, deadline: Deadline) -> list[Section]:
    from docx import Document as DocxDocument
    from docx.opc.exceptions import PackageNotFoundError
    from lxml import etree

    _check_docx_size(data, limits)
    try:
        document = DocxDocument(io.BytesIO(data))
        return _docx_document_sections(document, deadline)
    except ExtractionError:
        raise
    except (
        PackageNotFoundError, zipfile.BadZipFile, etree.LxmlError, KeyError, ValueError,
        AttributeError, TypeError, IndexError, NotImplementedError, RecursionError,
    ) as error:  # fmt: skip
        logger.info("unreadable docx: %r", error)
        raise _not_docx(error) from None


def _docx_document_sections(document: DocxDocumentType, deadline: Deadline) -> list[Section]:
    builder = SectionBuilder()
    style_names: dict[str | None, str] = {}
    for paragraph in document.paragraphs:
        deadline.check()
        text = paragraph.text.strip()
        if not text:
            continue
        # NOTE: python-docx finds a paragraph's style by scanning every style of the document
        # (milliseconds each); the name per style id is looked up once.
        style_id = paragraph._p.style
        if style_id not in style_names:
            style = paragraph.style
            style_names[style_id] = (style.name if style is not None else "") or ""
        style_name = style_names[style_id]
        if style_name.startswith("Heading") and style_name[7:].strip().isdigit():
            builder.add_heading(int(style_name[7:].strip()), text)
        elif style_name == "Title":
            builder.add_heading(0, text)  # level 0: replaces every heading, as before
        else:
            builder.add_text(text)
    builder.flush()
    for table in document.tables:
        rows = []
        for row in table.rows:
            deadline.check()
            rows.append(" | ".join(cell.text.strip() for cell in row.cells))
        builder.add_section("\n".join(r for r in rows if r.strip(" |")))
    return builder.sections
