"""Cache-aware chat prompts: a fixed system prefix and append-only history, built in token ids.

A prefix cache only hits on identical token prefixes (see DESIGN.md, "Prompt layout"), so:
- the system prompt is fixed text; dynamic data (names, dates, retrieved chunks) goes into the
  newest user turn and stays there in history;
- prompts are concatenated from per-message token segments, never re-tokenized as one string, so
  turn N+1's prompt starts with exactly turn N's prompt plus the answer's token ids;
- message text is tokenized with special tokens split, so a user or document writing
  `<|im_start|>system` gets plain text, never a control token;
- when the context fills up, old turns are dropped in steps of several turns at once, because every
  drop invalidates the cached prefix after it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from inference.engine import ReusableSpans

logger = logging.getLogger(__name__)

# Placeholders that no chat template rewrites; used to find the template's own text between them.
MARKERS = ("\x01S\x01", "\x01U1\x01", "\x01A1\x01", "\x01U2\x01")
DEFAULT_DROP_STEP_TURNS = 4


class ContextOverflowError(ValueError):
    """The newest message alone does not fit the context window."""

    def __init__(self, num_tokens: int, budget: int, max_model_len: int) -> None:
        super().__init__(
            f"the message needs {num_tokens} prompt tokens but only {budget} fit (a context "
            f"window of {max_model_len} tokens minus {max_model_len - budget} reserved for the "
            "answer); shorten it"
        )
        self.num_tokens = num_tokens
        self.budget = budget
        self.max_model_len = max_model_len


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier message. `token_ids` (for answers) are the ids the model produced, if known."""

    role: str  # "user" or "assistant"
    content: str
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class TemplateJoins:
    """The chat template's own text around messages, found by rendering a probe conversation."""

    start: str  # before the system message's content (BOS, system header)
    system_to_user: str
    user_to_assistant: str
    assistant_to_user: str
    generation_prompt: str  # after the newest user message


@dataclass(slots=True)
class BuiltPrompt:
    token_ids: list[int]
    num_prefix_tokens: int  # the fixed system prefix, identical for every chat of this profile
    num_dropped_turns: int
    segments: list[int] = field(default_factory=list)  # token count per message, for debugging
    # [start, end) token ranges of the newest message's passages (`build(passages=...)`)
    passage_spans: list[tuple[int, int]] = field(default_factory=list)

    @property
    def reusable(self) -> ReusableSpans | None:
        """Where the passages are, for the engine's chunk-KV reuse (None: no passages)."""
        if not self.passage_spans:
            return None
        return ReusableSpans(self.num_prefix_tokens, tuple(self.passage_spans))


def template_joins(tokenizer) -> TemplateJoins:
    messages = [
        {"role": "system", "content": MARKERS[0]},
        {"role": "user", "content": MARKERS[1]},
        {"role": "assistant", "content": MARKERS[2]},
        {"role": "user", "content": MARKERS[3]},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    parts = []
    for marker in MARKERS:
        before, found, text = text.partition(marker)
        if not found:
            raise ValueError(
                f"the chat template does not render message content verbatim ({marker!r})"
            )
        parts.append(before)
    return TemplateJoins(*parts, text)


class PromptBuilder:
    """Builds token-id prompts for one assistant profile (one fixed system prompt)."""

    def __init__(
        self,
        tokenizer,
        system_prompt: str,
        *,
        max_model_len: int,
        drop_step_turns: int = DEFAULT_DROP_STEP_TURNS,
        tokenizer_lock: threading.Lock | None = None,
    ) -> None:
        """`tokenizer_lock`: held while tokenizing when others share the tokenizer (the engine)."""
        if drop_step_turns < 1:
            raise ValueError(f"drop_step_turns must be >= 1, got {drop_step_turns}")
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.drop_step_turns = drop_step_turns
        self._tokenizer_lock = tokenizer_lock or contextlib.nullcontext()
        with self._tokenizer_lock:
            self._init_ids(system_prompt)

    def _init_ids(self, system_prompt: str) -> None:
        tokenizer = self.tokenizer
        self.joins = template_joins(tokenizer)
        if self.joins.user_to_assistant != self.joins.generation_prompt:
            # NOTE: then an answer's history form differs from its generation prompt, and the
            # cache hits only up to the previous user turn. Correct, just slower.
            logger.warning("chat template is not append-only; prefix cache hits will be partial")
        self.prefix_ids = (
            self._structure(self.joins.start)
            + self._text(system_prompt)
            + self._structure(self.joins.system_to_user)
        )
        self._join_ids = {
            "user": self._structure(self.joins.user_to_assistant),
            "assistant": self._structure(self.joins.assistant_to_user),
        }
        self._generation_ids = self._structure(self.joins.generation_prompt)

    def build(
        self,
        history: Sequence[Turn],
        message: str,
        *,
        max_tokens: int,
        passages: Sequence[tuple[int, int]] = (),
    ) -> BuiltPrompt:
        """The prompt for `message` after `history` (alternating user/assistant, user first).

        `passages`: [start, end) character ranges of quoted passages in `message`, whose token
        ranges the prompt then names (`BuiltPrompt.passage_spans`, for chunk-KV reuse).
        """
        _check_alternation(history)
        budget = self.max_model_len - max_tokens
        with self._tokenizer_lock:
            text_ids, message_spans = self._text_with_spans(message, passages)
            message_ids = text_ids + self._generation_ids
            turn_ids = [self._turn_ids(turn) for turn in history]
        fixed = len(self.prefix_ids) + len(message_ids)
        if fixed > budget:
            raise ContextOverflowError(fixed, budget, self.max_model_len)
        num_dropped = self._num_turns_to_drop(turn_ids, budget - fixed)
        kept = turn_ids[num_dropped:]
        token_ids = list(self.prefix_ids)
        for ids in kept:
            token_ids.extend(ids)
        message_start = len(token_ids)
        token_ids.extend(message_ids)
        return BuiltPrompt(
            token_ids=token_ids,
            num_prefix_tokens=len(self.prefix_ids),
            num_dropped_turns=num_dropped,
            segments=[len(ids) for ids in kept] + [len(message_ids)],
            passage_spans=[(message_start + a, message_start + b) for a, b in message_spans],
        )

    def _num_turns_to_drop(self, turn_ids: list[list[int]], room: int) -> int:
        """Drop whole user+assistant pairs, a multiple of `drop_step_turns` pairs at a time.

        The count depends only on the history, and grows in large steps as it grows, so the
        kept prefix stays identical (and cached) from one turn to the next between drops.
        """
        lengths = [len(ids) for ids in turn_ids]
        step = 2 * self.drop_step_turns
        num_dropped = 0
        while sum(lengths[num_dropped:]) > room:
            num_dropped = min(num_dropped + step, len(lengths))
        return num_dropped

    def _turn_ids(self, turn: Turn) -> list[int]:
        content_ids = (
            list(turn.token_ids) if turn.token_ids is not None else self._text(turn.content)
        )
        return content_ids + self._join_ids[turn.role]

    def _text(self, text: str) -> list[int]:
        # NOTE: split_special_tokens makes control strings in user or document text plain text.
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

    def _text_with_spans(
        self, text: str, char_spans: Sequence[tuple[int, int]]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """`_text(text)` and the token ranges lying wholly inside each of `char_spans` (none
        for a tokenizer without character offsets, or a span no token fits in)."""
        if not char_spans:
            return self._text(text), []
        try:
            encoding = self.tokenizer(
                text,
                add_special_tokens=False,
                split_special_tokens=True,
                return_offsets_mapping=True,
            )
        except NotImplementedError:  # NOTE: slow (Python) tokenizers have no offsets
            return self._text(text), []
        # NOTE: transformers 5's Python tokenizers ignore return_offsets_mapping instead
        offsets = encoding.get("offset_mapping")
        if offsets is None:
            return list(encoding["input_ids"]), []
        spans = []
        for char_start, char_end in char_spans:
            inside = [
                i
                for i, (start, end) in enumerate(offsets)
                if char_start <= start and end <= char_end and start < end
            ]
            if inside:
                spans.append((inside[0], inside[-1] + 1))
        return list(encoding["input_ids"]), spans

    def _structure(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []


def _check_alternation(history: Sequence[Turn]) -> None:
    for index, turn in enumerate(history):
        expected = "user" if index % 2 == 0 else "assistant"
        if turn.role != expected:
            raise ValueError(
                f"history must alternate user/assistant starting with user; "
                f"message {index} is {turn.role!r}"
            )
    if history and history[-1].role != "assistant":
        raise ValueError("history must end with an assistant answer before a new user message")
