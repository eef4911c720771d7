"""A document's text put back together from its chunks, with one cited chunk's span marked.

The extracted text itself is not stored; the chunks are, each with its span (`char_start`,
`char_end`) in it. Consecutive chunks of a section overlap (chunking.py carries trailing units
over), so each chunk adds only what lies past the text already laid out; what lies between two
chunks is whitespace the chunker left out (a paragraph break or the section separator) and comes
back as one. A new page or heading path starts a new block, which is how the reader sees them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from retrieval.models import Chunk, Document

PARAGRAPH_BREAK = "\n\n"


@dataclass(slots=True)
class Piece:
    text: str
    # The chunk that starts here (the page anchors `#chunk-<id>` on it), if any.
    anchor_chunk_id: int | None = None


@dataclass(slots=True)
class Run:
    """Consecutive pieces inside the cited span (`is_cited`) or outside it."""

    is_cited: bool
    pieces: list[Piece] = field(default_factory=list)


@dataclass(slots=True)
class Block:
    page: int | None
    heading_path: list[str]
    runs: list[Run] = field(default_factory=list)

    def add(self, text: str, is_cited: bool, anchor_chunk_id: int | None = None) -> None:
        if not text and anchor_chunk_id is None:
            return
        if not self.runs or self.runs[-1].is_cited != is_cited:
            self.runs.append(Run(is_cited))
        self.runs[-1].pieces.append(Piece(text, anchor_chunk_id))


@dataclass(slots=True)
class CitedText:
    blocks: list[Block]
    # The cited chunk, when it is one of this document's (a re-ingested document has new chunks).
    cited: Chunk | None
    num_chunks: int


def cited_text(document: Document, cited_chunk_id: int | None = None) -> CitedText:
    """`document`'s text in blocks, the span of chunk `cited_chunk_id` in runs marked cited."""
    chunks = list(document.chunks.order_by("ordinal"))
    cited = next((c for c in chunks if c.pk == cited_chunk_id), None)
    blocks: list[Block] = []
    for group in _groups(chunks):
        block = Block(group[0].page, list(group[0].heading_path))
        _lay_out(block, group, cited if cited in group else None)
        blocks.append(block)
    return CitedText(blocks, cited, len(chunks))


def _groups(chunks: list[Chunk]) -> list[list[Chunk]]:
    """Runs of consecutive chunks of one page and heading path."""
    groups: list[list[Chunk]] = []
    for chunk in chunks:
        if groups and (groups[-1][0].page, groups[-1][0].heading_path) == (
            chunk.page,
            chunk.heading_path,
        ):
            groups[-1].append(chunk)
        else:
            groups.append([chunk])
    return groups


def _lay_out(block: Block, chunks: list[Chunk], cited: Chunk | None) -> None:
    """Adds the text of `chunks` (one section's) to `block`, each character once, cut where a
    chunk starts (its anchor) and where the cited span starts and ends."""
    starts: dict[int, int] = {}
    for chunk in chunks:
        if _fits_span(chunk):
            starts.setdefault(chunk.char_start, chunk.pk)
    cuts = set(starts)
    # The cited span in document characters, when it has a place there.
    span = cited if cited is not None and _fits_span(cited) else None
    if span is not None:
        cuts |= {span.char_start, span.char_end}
    laid_out_to: int | None = None  # where the text laid out so far ends, in document characters
    for chunk in chunks:
        if not _fits_span(chunk):
            # NOTE: a span that does not match its text (chunking.py never writes one) cannot be
            # placed: the chunk is shown whole, and marked whole when cited.
            block.add(chunk.text, chunk == cited, chunk.pk)
            continue
        if laid_out_to is not None and chunk.char_start > laid_out_to:
            block.add(PARAGRAPH_BREAK, _covers(span, laid_out_to, chunk.char_start))
        start = chunk.char_start if laid_out_to is None else max(chunk.char_start, laid_out_to)
        if start >= chunk.char_end:
            continue  # all of it is laid out already; its anchor was placed with it
        bounds = sorted({start, chunk.char_end} | {c for c in cuts if start < c < chunk.char_end})
        for low, high in itertools.pairwise(bounds):
            text = chunk.text[low - chunk.char_start : high - chunk.char_start]
            block.add(text, _covers(span, low, high), starts.pop(low, None))
        laid_out_to = chunk.char_end


def _fits_span(chunk: Chunk) -> bool:
    return len(chunk.text) == chunk.char_end - chunk.char_start


def _covers(cited: Chunk | None, start: int, end: int) -> bool:
    """Whether [start, end) lies inside the cited span."""
    return cited is not None and cited.char_start <= start and end <= cited.char_end
