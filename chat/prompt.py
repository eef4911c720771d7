"""A turn's prompt at the message level: system prompt, history, passages and question.

Everything dynamic goes into the newest user turn (retrieved passages, today's facts), never the
system prompt (DESIGN.md, "Prompt layout"): that turn is stored with the question and replayed
verbatim in later prompts, so it stays cached. A passage already quoted in the history is named,
not repeated. A remote backend gets the result as OpenAI messages (`chat_messages`); the
in-process engine gets it through its token-level builder (inference.prompts), which may drop
old turns, so `build_with_passages` lays the turn out again against the turns actually kept.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from chat.models import Message
from inference.prompts import BuiltPrompt, PromptBuilder, Turn
from retrieval.search import SearchHit

SNIPPET_CHARS = 2000
MAX_PASSAGE_LAYOUTS = 3

History = Sequence[Turn | Message]  # earlier turns, oldest first, alternating user/assistant


@dataclass(frozen=True, slots=True)
class UserTurn:
    """The newest user turn as the model sees it, and the sources its "[n]" refer to."""

    text: str
    sources: list[dict]
    # [start, end) character ranges of the passages quoted in full in `text`
    passage_spans: tuple[tuple[int, int], ...] = ()


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
        "url": f"/documents/{hit.document_id}/?chunk={hit.chunk_id}#chunk-{hit.chunk_id}",
        "quoted_earlier": quoted_earlier,
    }


def facts_line(user_name: str, today: datetime.date) -> str:
    return f"Today is {today:%A, %B %-d, %Y}. I am {user_name}."


def user_turn_text(
    question: str,
    hits: Sequence[SearchHit],
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
    text, _ = user_turn_layout(
        question,
        hits,
        user_name=user_name,
        today=today,
        quoted_earlier=quoted_earlier,
        known_facts=known_facts,
    )
    return text


def user_turn_layout(
    question: str,
    hits: Sequence[SearchHit],
    *,
    user_name: str,
    today: datetime.date,
    quoted_earlier: Collection[int] = frozenset(),
    known_facts: str = "",
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """`user_turn_text` and the character range of each passage it quotes in full (what the
    engine may reuse the keys/values of: the passage's own text, not its numbered heading)."""
    text = ""
    spans: list[tuple[int, int]] = []

    def add(part: str, passage: str = "") -> None:
        nonlocal text
        text += ("\n\n" if text else "") + part
        if passage:
            text += "\n"
            spans.append((len(text), len(text) + len(passage)))
            text += passage

    if hits:
        add("Context passages from the team's documents:")
        for number, hit in enumerate(hits, start=1):
            where = " > ".join([hit.document_title, *hit.heading_path])
            if hit.page is not None:
                where += f" (page {hit.page})"
            if hit.chunk_id in quoted_earlier:
                add(f"[{number}] {where} (quoted above)")
            else:
                add(f"[{number}] {where}", hit.text.strip())
    facts = facts_line(user_name, today)
    if facts not in known_facts:
        add(facts)
    add(f"Question: {question.strip()}" if hits else question.strip())
    return text, tuple(spans)


def lay_out_user_turn(
    question: str,
    hits: Sequence[SearchHit],
    kept_history: History,
    *,
    user_name: str,
    today: datetime.date,
    quote_all: bool = False,
) -> UserTurn:
    """The user turn and its sources, given the earlier turns the prompt keeps."""
    quoted = set() if quote_all else _quoted_chunk_ids(kept_history)
    sources = [
        source_json(n, hit, quoted_earlier=hit.chunk_id in quoted)
        for n, hit in enumerate(hits, start=1)
    ]
    text, passage_spans = user_turn_layout(
        question,
        hits,
        user_name=user_name,
        today=today,
        quoted_earlier=quoted,
        known_facts=_user_turns_text(kept_history),
    )
    return UserTurn(text, sources, passage_spans)


def build_with_passages(
    builder: PromptBuilder,
    question: str,
    hits: Sequence[SearchHit],
    history: History,
    *,
    model_name: str,
    user_name: str,
    today: datetime.date,
    max_tokens: int,
) -> tuple[BuiltPrompt, UserTurn]:
    """The engine's prompt with this turn's passages; ones still quoted in the kept history are
    named.

    Dropping old turns (a full context) can drop a quote (or today's facts), so the layout is
    redone against the turns actually kept until it is stable; failing that, every passage is
    quoted in full.
    """
    turns = history_turns(history, model_name)
    num_kept_from = 0
    for attempt in range(MAX_PASSAGE_LAYOUTS + 1):
        user_turn = lay_out_user_turn(
            question,
            hits,
            history[num_kept_from:],
            user_name=user_name,
            today=today,
            quote_all=attempt == MAX_PASSAGE_LAYOUTS,
        )
        prompt = builder.build(
            turns, user_turn.text, max_tokens=max_tokens, passages=user_turn.passage_spans
        )
        if prompt.num_dropped_turns == num_kept_from:
            break
        num_kept_from = prompt.num_dropped_turns
    return prompt, user_turn


def history_turns(history: History, model_name: str) -> list[Turn]:
    """The earlier turns as `model_name` is shown them."""
    return [_history_turn(item, model_name) for item in history]


def chat_messages(system_prompt: str, history: Sequence[Turn], user_turn: str) -> list[dict]:
    """OpenAI messages: the system prompt, earlier turns (as `Turn`s), the newest user turn."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += [{"role": turn.role, "content": turn.content} for turn in history]
    messages.append({"role": "user", "content": user_turn})
    return messages


def history_chars(history: History) -> int:
    """The history's size in characters, as the routing rules count it."""
    return sum(
        len(item.content if isinstance(item, Turn) else item.prompt_content or item.content)
        for item in history
    )


def _history_turn(message: Turn | Message, model_name: str) -> Turn:
    if isinstance(message, Turn):
        return message
    if message.role == Message.Role.USER:
        return Turn("user", message.prompt_content or message.content)
    # NOTE: the model's own token ids keep the cached prefix exact; another model's ids are not
    # ours to reuse, so its text is tokenized afresh.
    same_model = message.model == model_name and message.token_ids is not None
    return Turn("assistant", message.content, tuple(message.token_ids) if same_model else None)


def _user_turns_text(history: History) -> str:
    return "\n".join(
        item.prompt_content
        for item in history
        if isinstance(item, Message) and item.role == Message.Role.USER
    )


def _quoted_chunk_ids(history: History) -> set[int]:
    """Chunks whose full text is in these turns (earlier questions' passages)."""
    return {
        source["chunk_id"]
        for item in history
        if isinstance(item, Message) and item.role == Message.Role.USER
        for source in item.sources
        if not source.get("quoted_earlier")
    }
