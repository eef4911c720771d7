"""Token-aware chunking that respects heading and paragraph boundaries.

Sections (a heading's body, or a pdf page) are never merged. Inside one, paragraphs are packed
greedily up to `max_tokens` (counted with the embedding model's tokenizer); a paragraph that does
not fit alone is split at sentence ends, and a sentence that does not fit alone at token
boundaries. Consecutive chunks of one section share up to `overlap_tokens` of trailing units.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from retrieval.extract import Section

SECTION_SEPARATOR = "\n\n"
PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


class Tokenizer(Protocol):
    def __call__(self, text: list[str], **kwargs: Any) -> Mapping[str, Any]: ...


@dataclass(slots=True)
class ChunkDraft:
    text: str
    token_count: int
    char_start: int  # into the document text: sections joined by SECTION_SEPARATOR
    char_end: int
    page: int | None = None
    heading_path: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Unit:
    start: int
    end: int
    tokens: int


def document_text(sections: Sequence[Section]) -> str:
    return SECTION_SEPARATOR.join(s.text for s in sections)


def chunk_sections(
    sections: Sequence[Section], tokenizer: Tokenizer, max_tokens: int, overlap_tokens: int
) -> list[ChunkDraft]:
    if max_tokens < 16:
        raise ValueError(f"max_tokens must be at least 16; got {max_tokens}")
    if not 0 <= overlap_tokens < max_tokens // 2:
        raise ValueError(f"overlap_tokens must be in [0, max_tokens/2); got {overlap_tokens}")
    drafts: list[ChunkDraft] = []
    offset = 0
    for section in sections:
        text = section.text
        for unit_group in _pack(_units(text, tokenizer, max_tokens), max_tokens, overlap_tokens):
            start, end = unit_group[0].start, unit_group[-1].end
            drafts.append(
                ChunkDraft(
                    text=text[start:end],
                    token_count=sum(u.tokens for u in unit_group),
                    char_start=offset + start,
                    char_end=offset + end,
                    page=section.page,
                    heading_path=list(section.heading_path),
                )
            )
        offset += len(text) + len(SECTION_SEPARATOR)
    return drafts


def _spans(text: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    spans, cursor = [], start
    for match in pattern.finditer(text, start, end):
        spans.append((cursor, match.start()))
        cursor = match.end()
    spans.append((cursor, end))
    return [(a, b) for a, b in spans if text[a:b].strip()]


def _count(tokenizer: Tokenizer, text: str, spans: list[tuple[int, int]]) -> list[int]:
    if not spans:
        return []
    encoded = tokenizer([text[a:b] for a, b in spans], add_special_tokens=False)
    return [len(ids) for ids in encoded["input_ids"]]


def _units(text: str, tokenizer: Tokenizer, max_tokens: int) -> list[_Unit]:
    """Paragraphs, or their sentences, or token windows: each at most max_tokens long."""
    units: list[_Unit] = []
    paragraphs = _spans(text, PARAGRAPH_BREAK, 0, len(text))
    for (p_start, p_end), p_tokens in zip(
        paragraphs, _count(tokenizer, text, paragraphs), strict=False
    ):
        if p_tokens <= max_tokens:
            units.append(_Unit(p_start, p_end, p_tokens))
            continue
        sentences = _spans(text, SENTENCE_END, p_start, p_end)
        for (s_start, s_end), s_tokens in zip(
            sentences, _count(tokenizer, text, sentences), strict=False
        ):
            if s_tokens <= max_tokens:
                units.append(_Unit(s_start, s_end, s_tokens))
            else:
                units.extend(_token_windows(text, s_start, s_end, tokenizer, max_tokens))
    return units


def _token_windows(
    text: str, start: int, end: int, tokenizer: Tokenizer, max_tokens: int
) -> list[_Unit]:
    encoded = tokenizer([text[start:end]], add_special_tokens=False, return_offsets_mapping=True)
    offsets = encoded["offset_mapping"][0]
    windows = []
    for first in range(0, len(offsets), max_tokens):
        piece = offsets[first : first + max_tokens]
        windows.append(_Unit(start + piece[0][0], start + piece[-1][1], len(piece)))
    return windows


def _pack(units: list[_Unit], max_tokens: int, overlap_tokens: int) -> list[list[_Unit]]:
    groups: list[list[_Unit]] = []
    current: list[_Unit] = []
    fresh = 0  # units in `current` not carried over from the previous chunk
    for unit in units:
        if current and sum(u.tokens for u in current) + unit.tokens > max_tokens:
            if fresh:
                groups.append(current)
            carried: list[_Unit] = []
            for previous in reversed(current):
                if sum(u.tokens for u in carried) + previous.tokens > overlap_tokens:
                    break
                carried.insert(0, previous)
            while carried and sum(u.tokens for u in carried) + unit.tokens > max_tokens:
                carried.pop(0)
            current, fresh = carried, 0
        current.append(unit)
        fresh += 1
    if current and fresh:
        groups.append(current)
    return groups
