"""One chat turn, for the WebSocket consumer and the REST API alike.

retrieve → build the cache-aware prompt → stream from the engine → save the answer with its
sources and stats. `run_turn` is an async generator of events (`TurnStarted`, `SourcesFound`,
`TokenDelta`, `TurnDone`); problems a client can act on raise `ChatError` with a protocol error
code (docs/chat-protocol.md). The user's message is saved before anything can fail, and an answer
that is stopped, cut short or fails midway is saved with what it had: nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import close_old_connections
from django.utils import timezone

from chat import store
from chat.context import source_json, user_turn_text
from chat.errors import ChatError
from chat.models import Conversation, Message
from chat.prompting import prompt_builder_for, sampling_params_for
from inference import runtime
from inference.engine.engine import Engine
from inference.engine.outputs import Delta, EngineClosedError, RequestFailedError, Usage
from inference.prompts import ContextOverflowError, Turn
from retrieval.search import search

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class TurnRequest:
    """What the client asked. `conversation_id=None` starts a new chat."""

    user: AbstractBaseUser
    content: str = ""
    conversation_id: int | None = None
    collection_ids: list[int] | None = None  # new chats only; None: the profile's defaults
    profile_id: int | None = None  # new chats only; None: the default profile
    seed: int | None = None  # None: a fresh random seed, saved with the answer
    regenerate: bool = False


@dataclass(slots=True)
class TurnControl:
    """Lets another task stop the turn; the partial answer is saved as "stopped"."""

    is_stopped: bool = False
    _engine: Engine | None = None
    _request_id: str | None = None

    def stop(self) -> None:
        self.is_stopped = True
        if self._engine is not None and self._request_id is not None:
            self._engine.abort(self._request_id)

    def attach(self, engine: Engine, request_id: str) -> None:
        self._engine, self._request_id = engine, request_id


@dataclass(frozen=True, slots=True)
class TurnStarted:
    conversation: Conversation
    user_message: Message | None  # None when regenerating


@dataclass(frozen=True, slots=True)
class SourcesFound:
    sources: list[dict]


@dataclass(frozen=True, slots=True)
class TokenDelta:
    text: str


@dataclass(frozen=True, slots=True)
class TurnDone:
    message: Message
    conversation: Conversation


TurnEvent = TurnStarted | SourcesFound | TokenDelta | TurnDone


@dataclass(slots=True)
class _Answer:
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None


async def run_turn(
    request: TurnRequest, control: TurnControl | None = None
) -> AsyncIterator[TurnEvent]:
    """Answer one message (or regenerate the last answer); see the module docstring."""
    control = control or TurnControl()
    begun = await store.begin_turn(request)
    yield TurnStarted(begun.conversation, None if request.regenerate else begun.question)

    question = begun.question
    if not question.prompt_content:
        hits = await _retrieve(request.user, question.content, begun)
        question.sources = [source_json(n, hit) for n, hit in enumerate(hits, start=1)]
        question.prompt_content = user_turn_text(
            question.content,
            hits,
            user_name=request.user.get_full_name() or request.user.get_username(),
            today=timezone.localdate(),
        )
        await store.save_question_context(question)
    yield SourcesFound(question.sources)

    try:
        engine, model_name = runtime.get_engine_and_model()
    except runtime.EngineUnavailable as error:
        raise ChatError("engine_unavailable", str(error)) from error
    params = sampling_params_for(begun.profile, begun.model_config, seed=request.seed)
    builder = prompt_builder_for(engine, begun.profile.system_prompt)
    history = [_history_turn(message, model_name) for message in begun.history]
    try:
        prompt = await sync_to_async(builder.build, thread_sensitive=False)(
            history, question.prompt_content, max_tokens=params.max_tokens
        )
    except ContextOverflowError as error:
        raise ChatError("context_overflow", str(error)) from error

    request_id = f"chat-{begun.conversation.pk}-{uuid.uuid4().hex[:12]}"
    try:
        stream = engine.stream(prompt.token_ids, params, request_id=request_id)
    except ValueError as error:  # PromptTooLongError and friends: checked before queueing
        raise ChatError("context_overflow", str(error)) from error
    control.attach(engine, request_id)
    answer = _Answer()
    try:
        # NOTE: the request is queued on the stream's first step, so a turn stopped before this
        # point never reaches the engine.
        if not control.is_stopped:
            async for delta in _read(stream, answer):
                yield TokenDelta(delta)
    finally:
        if answer.finish_reason is None:
            control.stop()  # the client went away mid-answer: free the engine's blocks now
        # NOTE: runs on stop, disconnect, engine failure and cancellation alike; shielded so a
        # cancelled task still saves what the user already saw.
        message = await asyncio.shield(
            store.save_answer(
                begun,
                content="".join(answer.text_parts),
                token_ids=_answer_token_ids(answer, engine),
                usage=answer.usage,
                num_prompt_tokens=len(prompt.token_ids),
                finish_reason=_finish_reason(answer, control),
                seed=params.seed,
                model_name=model_name,
            )
        )
    if answer.finish_reason == "error":
        raise ChatError("engine_error", "the engine failed while answering; try again")
    yield TurnDone(message, begun.conversation)


async def _retrieve(user: AbstractBaseUser, query: str, begun: store.BegunTurn) -> list:
    if not begun.collection_ids:
        return []
    top_k = begun.profile.search_top_k or settings.CACHET_SEARCH_TOP_K

    def run() -> list:
        try:
            return search(query, begun.collection_ids, top_k, user=user)
        finally:
            close_old_connections()

    try:
        return await sync_to_async(run, thread_sensitive=False)()
    except Exception:
        # NOTE: a broken index must not cost the user their answer; it is logged and repaired
        # at the next start (retrieval.consistency).
        logger.exception("retrieval failed; answering without sources")
        return []


async def _read(stream: AsyncIterator[Delta | Usage], answer: _Answer) -> AsyncIterator[str]:
    """Text deltas of `stream`, recording tokens, finish reason and usage into `answer`."""
    try:
        async for item in stream:
            if isinstance(item, Delta):
                answer.token_ids.extend(item.token_ids)
                if item.finish_reason is not None:
                    answer.finish_reason = item.finish_reason
                if item.text:
                    answer.text_parts.append(item.text)
                    yield item.text
            else:
                answer.usage = item
    except (RequestFailedError, EngineClosedError) as error:
        logger.warning("chat request ended by the engine: %s", error)
        answer.finish_reason = "error" if isinstance(error, RequestFailedError) else "abort"


def _answer_token_ids(answer: _Answer, engine: Engine) -> list[int]:
    token_ids = list(answer.token_ids)
    # NOTE: the chat template closes an answer itself; an eos kept here would appear twice.
    while token_ids and token_ids[-1] in engine.eos_token_ids:
        token_ids.pop()
    return token_ids


def _finish_reason(answer: _Answer, control: TurnControl) -> str:
    if control.is_stopped and answer.finish_reason in (None, "abort"):
        return "stopped"
    return answer.finish_reason or "stopped"


def _history_turn(message: Message, model_name: str) -> Turn:
    if message.role == Message.Role.USER:
        return Turn("user", message.prompt_content or message.content)
    # NOTE: the model's own token ids keep the cached prefix exact; another model's ids are not
    # ours to reuse, so its text is tokenized afresh.
    same_model = message.model == model_name and message.token_ids is not None
    return Turn("assistant", message.content, tuple(message.token_ids) if same_model else None)
