"""What a chat turn yields, in order: `TurnStarted`, `SourcesFound`, `TokenDelta`s, `TurnDone`.

The WebSocket consumer turns each into a protocol frame (docs/chat-protocol.md); the REST API
reads the answer loop's `SourcesFound` and `TokenDelta`s. Problems a client can act on are not
events: they raise `chat.errors.ChatError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from chat.models import Conversation, Message


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """The question is saved (in a new conversation, for a new chat)."""

    conversation: Conversation
    user_message: Message | None  # None when regenerating


@dataclass(frozen=True, slots=True)
class SourcesFound:
    """The passages the answer may cite as "[n]" (the protocol's Sources); the answer is queued."""

    sources: list[dict]


@dataclass(frozen=True, slots=True)
class TokenDelta:
    text: str


@dataclass(frozen=True, slots=True)
class TurnDone:
    """The answer is saved (also when it was stopped or cut short)."""

    message: Message
    conversation: Conversation


TurnEvent = TurnStarted | SourcesFound | TokenDelta | TurnDone
AnswerEvent = SourcesFound | TokenDelta
