"""The newest user turn as the model sees it: retrieved passages, today's facts, the question.

Everything dynamic lives here, never in the system prompt (DESIGN.md, "Prompt layout"): the
turn is stored with the message and replayed verbatim in later prompts, so it stays cached.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection

from retrieval.search import SearchHit

SNIPPET_CHARS = 2000


def source_json(number: int, hit: SearchHit, *, quoted_earlier: bool = False) -> dict:
    """The protocol's Source (docs/chat-protocol.md) for citation `[number]`.

    `quoted_earlier`: the passage's text is already in the conversation, so this turn's prompt
    only refers to it.
    """
    return {
        "n": number,
        "chunk_id": hit.chunk_id,
        "document_id": hit.document_id,
        "document_title": hit.document_title,
        "collection": hit.collection_name,
        "page": hit.page,
        "heading_path": list(hit.heading_path),
        "snippet": hit.text[:SNIPPET_CHARS],
        "score": round(float(hit.score), 4),
        "url": f"/documents/{hit.document_id}/#chunk-{hit.chunk_id}",
        "quoted_earlier": quoted_earlier,
    }


def facts_line(user_name: str, today: datetime.date) -> str:
    return f"Today is {today:%A, %B %-d, %Y}. I am {user_name}."


def user_turn_text(
    question: str,
    hits: list[SearchHit],
    *,
    user_name: str,
    today: datetime.date,
    quoted_earlier: Collection[int] = frozenset(),
    known_facts: str = "",
) -> str:
    """The user turn with numbered passages first, so "[n]" in the answer names a source.

    A passage whose chunk id is in `quoted_earlier` is already quoted in the conversation's
    history: it is named, not repeated, which keeps each new turn short (less to prefill, more
    of the prompt served from the prefix cache). Today's facts are left out when `known_facts`
    (the conversation's earlier user turns) already state them.
    """
    parts = []
    if hits:
        parts.append("Context passages from the team's documents:")
        for number, hit in enumerate(hits, start=1):
            where = " > ".join([hit.document_title, *hit.heading_path])
            if hit.page is not None:
                where += f" (page {hit.page})"
            if hit.chunk_id in quoted_earlier:
                parts.append(f"[{number}] {where} (quoted above)")
            else:
                parts.append(f"[{number}] {where}\n{hit.text.strip()}")
    facts = facts_line(user_name, today)
    if facts not in known_facts:
        parts.append(facts)
    parts.append(f"Question: {question.strip()}" if hits else question.strip())
    return "\n\n".join(parts)
