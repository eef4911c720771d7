"""One chat turn, for the WebSocket consumer and the REST API alike.

retrieve → build the cache-aware prompt → stream from the engine → save the answer with its
sources and stats. `run_turn` is an async generator of events (`TurnStarted`, `SourcesFound`,
`TokenDelta`, `TurnDone`); problems a client can act on raise `ChatError` with a protocol error
code (docs/chat-protocol.md). The user's message is saved before anything can fail, and an answer
that is stopped, cut short or fails midway is saved with what it had: nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import close_old_connections
from django.utils import timezone

from backends import metrics as backend_metrics
from backends.client import RemoteStream, RemoteStreamError
from backends.replicas import NoReplicaAvailable
from backends.routing import LOCAL_BACKEND, ProfileRouting, Route, TurnShape
from chat import store
from chat.context import source_json, user_turn_text
from chat.errors import ChatError
from chat.models import Conversation, Message
from chat.prompting import cache_salt_for, prompt_builder_for, sampling_params_for
from chat.remote_turn import chat_messages, choose_turn_route, open_remote_answer
from inference import runtime
from inference.engine import (
    Delta,
    Engine,
    EngineClosedError,
    RequestFailedError,
    SamplingParams,
    Usage,
)
from inference.prompts import Turn
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
    model: str | None = None  # an explicit model choice; None: the routing rules


@dataclass(slots=True)
class TurnControl:
    """Lets another task stop the turn; the partial answer is saved as "stopped"."""

    is_stopped: bool = False
    _engine: Engine | None = None
    _request_id: str | None = None
    _stream: RemoteStream | None = None

    def stop(self) -> None:
        self.is_stopped = True
        if self._engine is not None and self._request_id is not None:
            self._engine.abort(self._request_id)
        if self._stream is not None:
            self._stream.abort()  # closing the stream is how a remote request is cancelled

    def attach(self, engine: Engine, request_id: str) -> None:
        self._engine, self._request_id = engine, request_id

    def attach_stream(self, stream: RemoteStream) -> None:
        self._stream = stream


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
class TurnInput:
    """What one answer is made from, wherever the question came from (chat or REST API).

    `history` holds earlier turns, oldest first, alternating user/assistant: `Turn`s, or saved
    `Message`s (whose answers replay the model's own token ids). `prompt_content` is the newest
    user turn as the model saw it, when known (regenerating); otherwise it is built here from the
    question and the passages retrieved from `collection_ids`.
    """

    user: AbstractBaseUser
    question: str
    system_prompt: str
    params: SamplingParams
    history: list[Turn | Message] = field(default_factory=list)
    collection_ids: list[int] = field(default_factory=list)
    search_top_k: int | None = None
    prompt_content: str | None = None
    sources: list[dict] = field(default_factory=list)
    request_id_prefix: str = "chat"
    cache_salt: str | None = None
    requested_model: str | None = None  # explicit model choice (backends.routing)
    profile_routing: str = ProfileRouting.AUTO


@dataclass(slots=True)
class Answer:
    """The answer as it grows; complete once `finish_reason` is set (filled by `answer_turn`)."""

    prompt_content: str = ""
    sources: list[dict] = field(default_factory=list)
    model_name: str = ""
    num_prompt_tokens: int = 0
    is_started: bool = False  # reached the engine: there is something to save
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    backend: str = LOCAL_BACKEND  # who answered: "local" or an InferenceBackend's name
    route: str = ""  # the routing rule that chose it (backends.routing), or "fallback"

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


async def answer_turn(
    turn: TurnInput, answer: Answer, control: TurnControl | None = None
) -> AsyncIterator[SourcesFound | TokenDelta]:
    """Retrieve, build the cache-aware prompt, and stream the answer into `answer`.

    Yields `SourcesFound` once, then `TokenDelta`s. Raises `ChatError` before `SourcesFound`
    (model unavailable, context overflow, unknown model); afterwards every ending — done,
    stopped, closed early, engine or backend failure — leaves `answer` with a finish reason and
    frees the request. The router (backends.routing) picks the in-process engine or a remote
    model; `answer.backend` and `answer.route` say which and why.
    """
    control = control or TurnControl()
    answer.sources, answer.prompt_content = turn.sources, turn.prompt_content or ""
    hits = await _retrieve(turn) if turn.prompt_content is None else []
    route = await choose_turn_route(_shape_of(turn, hits))
    answer.route = route.reason
    if route.is_remote:
        stream = await _open_remote(turn, hits, answer, route)
        if stream is not None:
            # NOTE: aclosing, so closing this generator ends the remote answer (closing its
            # stream, setting its finish reason) before the caller saves it.
            async with contextlib.aclosing(_answer_remotely(stream, answer, control)) as events:
                async for event in events:
                    yield event
            return
        answer.route = "fallback"

    try:
        engine, answer.model_name = runtime.get_engine_and_model()
    except runtime.EngineUnavailable as error:
        backend_metrics.record_unavailable(LOCAL_BACKEND)
        raise ChatError("engine_unavailable", str(error)) from error
    builder = prompt_builder_for(engine, turn.system_prompt)
    history = [_history_turn(item, answer.model_name) for item in turn.history]
    try:
        if turn.prompt_content is None:
            prompt = await sync_to_async(_build_with_passages, thread_sensitive=False)(
                builder, turn, history, hits, answer
            )
        else:
            prompt = await sync_to_async(builder.build, thread_sensitive=False)(
                history, answer.prompt_content, max_tokens=turn.params.max_tokens or 1
            )
        request_id = f"{turn.request_id_prefix}-{uuid.uuid4().hex[:16]}"
        stream = engine.stream(
            prompt.token_ids, turn.params, request_id=request_id, cache_salt=turn.cache_salt
        )
    except ValueError as error:  # ContextOverflowError, PromptTooLongError: before queueing
        raise ChatError("context_overflow", str(error)) from error
    answer.num_prompt_tokens = len(prompt.token_ids)
    answer.is_started = True
    control.attach(engine, request_id)
    backend_metrics.record_route(LOCAL_BACKEND, answer.route)
    # NOTE: sources come after everything that can refuse the turn, so a caller that waits for
    # them (the REST API) can still answer a refusal with its own status code.
    yield SourcesFound(answer.sources)
    try:
        # NOTE: the request is queued on the stream's first step, so a turn stopped before this
        # point never reaches the engine.
        if not control.is_stopped:
            async for text in _read(stream, answer):
                yield TokenDelta(text)
    finally:
        if answer.finish_reason is None:
            control.stop()  # the client went away mid-answer: free the engine's blocks now
        answer.finish_reason = _finish_reason(answer, control)
        # NOTE: the chat template closes an answer itself; an eos kept here would appear twice.
        while answer.token_ids and answer.token_ids[-1] in engine.eos_token_ids:
            answer.token_ids.pop()
        backend_metrics.record_request(LOCAL_BACKEND, answer.finish_reason)


async def _open_remote(
    turn: TurnInput, hits: list, answer: Answer, route: Route
) -> RemoteStream | None:
    """The stream of `route`'s model, or None when no replica can take the turn and the route
    may fall back to the in-process engine."""
    if turn.prompt_content is None:
        # NOTE: the whole history is sent; a remote model's context is the remote's concern
        # (an overflow comes back as context_overflow).
        _lay_out_passages(turn, hits, answer, num_kept_from=0)
    history = [_history_turn(item, route.model) for item in turn.history]
    messages = chat_messages(turn.system_prompt, history, answer.prompt_content)
    request_id = f"{turn.request_id_prefix}-{uuid.uuid4().hex[:16]}"
    try:
        return await open_remote_answer(route, messages, turn.params, request_id)
    except NoReplicaAvailable as error:
        backend_metrics.record_unavailable(route.model)
        if not route.may_fall_back:
            raise ChatError("backend_unavailable", str(error)) from None
        logger.warning("%s; the in-process engine answers instead", error)
        return None


async def _answer_remotely(
    stream: RemoteStream, answer: Answer, control: TurnControl
) -> AsyncIterator[SourcesFound | TokenDelta]:
    answer.backend, answer.model_name = stream.backend.name, stream.payload["model"]
    answer.is_started = True
    control.attach_stream(stream)
    backend_metrics.record_route(answer.backend, answer.route)
    yield SourcesFound(answer.sources)
    try:
        if not control.is_stopped:
            async for text in _read(stream, answer):
                yield TokenDelta(text)
    finally:
        if answer.finish_reason is None:
            control.stop()
        await stream.aclose()  # the remote server aborts a request whose stream is closed
        answer.finish_reason = _finish_reason(answer, control)
        backend_metrics.record_request(answer.backend, answer.finish_reason)


async def run_turn(
    request: TurnRequest, control: TurnControl | None = None
) -> AsyncIterator[TurnEvent]:
    """Answer one message of a saved conversation (or regenerate its last answer), and save it."""
    control = control or TurnControl()
    begun = await store.begin_turn(request)
    yield TurnStarted(begun.conversation, None if request.regenerate else begun.question)

    question = begun.question
    turn = TurnInput(
        user=request.user,
        question=question.content,
        system_prompt=begun.profile.system_prompt,
        params=sampling_params_for(begun.profile, begun.model_config, seed=request.seed),
        history=begun.history,
        collection_ids=begun.collection_ids,
        search_top_k=begun.profile.search_top_k,
        prompt_content=question.prompt_content or None,
        sources=question.sources,
        request_id_prefix=f"chat-{begun.conversation.pk}",
        cache_salt=cache_salt_for(request.user),
        requested_model=request.model,
        profile_routing=begun.profile.routing,
    )
    answer = Answer()
    try:
        # NOTE: aclosing, so a caller that stops reading ends answer_turn (which aborts the
        # request and sets the finish reason) before the answer below is saved.
        async with contextlib.aclosing(answer_turn(turn, answer, control)) as events:
            async for event in events:
                if isinstance(event, SourcesFound) and not question.prompt_content:
                    question.prompt_content = answer.prompt_content
                    question.sources = event.sources
                    await store.save_question_context(question)
                yield event
    finally:
        # NOTE: runs on stop, disconnect, engine failure and cancellation alike; shielded so a
        # cancelled task still saves what the user already saw.
        if answer.is_started:
            message = await asyncio.shield(store.save_answer(begun, answer, seed=turn.params.seed))
    if answer.finish_reason == "error":
        raise ChatError("engine_error", "the engine failed while answering; try again")
    yield TurnDone(message, begun.conversation)


MAX_PASSAGE_LAYOUTS = 3


def _build_with_passages(builder, turn: TurnInput, history: list[Turn], hits: list, answer):
    """The prompt with this turn's passages; ones still quoted in the kept history are named.

    Dropping old turns (a full context) can drop a quote (or today's facts), so the layout is
    redone against the turns actually kept until it is stable; failing that, every passage is
    quoted in full.
    """
    num_kept_from = 0
    for attempt in range(MAX_PASSAGE_LAYOUTS + 1):
        _lay_out_passages(
            turn,
            hits,
            answer,
            num_kept_from=num_kept_from,
            quote_all=attempt == MAX_PASSAGE_LAYOUTS,
        )
        prompt = builder.build(
            history, answer.prompt_content, max_tokens=turn.params.max_tokens or 1
        )
        if prompt.num_dropped_turns == num_kept_from:
            return prompt
        num_kept_from = prompt.num_dropped_turns
    return prompt


def _lay_out_passages(
    turn: TurnInput, hits: list, answer: Answer, *, num_kept_from: int, quote_all: bool = False
) -> None:
    """This turn's sources and user turn, given the history kept from `num_kept_from` on."""
    quoted = set() if quote_all else _quoted_chunk_ids(turn.history[num_kept_from:])
    answer.sources = [
        source_json(n, hit, quoted_earlier=hit.chunk_id in quoted)
        for n, hit in enumerate(hits, start=1)
    ]
    answer.prompt_content = user_turn_text(
        turn.question,
        hits,
        user_name=turn.user.get_full_name() or turn.user.get_username(),
        today=timezone.localdate(),
        quoted_earlier=quoted,
        known_facts=_user_turns_text(turn.history[num_kept_from:]),
    )


def _shape_of(turn: TurnInput, hits: list) -> TurnShape:
    """What the routing rules see: the turn's size in characters and passages."""
    history_chars = sum(
        len(item.content if isinstance(item, Turn) else item.prompt_content or item.content)
        for item in turn.history
    )
    if turn.prompt_content is None:
        newest_chars = len(turn.question) + sum(len(hit.text) for hit in hits)
        num_passages = len(hits)
    else:
        newest_chars, num_passages = len(turn.prompt_content), len(turn.sources)
    return TurnShape(
        requested_model=turn.requested_model,
        profile_routing=turn.profile_routing,
        prompt_chars=history_chars + newest_chars,
        num_passages=num_passages,
    )


def _user_turns_text(history: list[Turn | Message]) -> str:
    return "\n".join(
        item.prompt_content
        for item in history
        if isinstance(item, Message) and item.role == Message.Role.USER
    )


def _quoted_chunk_ids(history: list[Turn | Message]) -> set[int]:
    """Chunks whose full text is in these turns (earlier questions' passages)."""
    return {
        source["chunk_id"]
        for item in history
        if isinstance(item, Message) and item.role == Message.Role.USER
        for source in item.sources
        if not source.get("quoted_earlier")
    }


async def _retrieve(turn: TurnInput) -> list:
    if not turn.collection_ids:
        return []
    top_k = turn.search_top_k or settings.CACHET_SEARCH_TOP_K

    def run() -> list:
        try:
            return search(turn.question, turn.collection_ids, top_k, user=turn.user)
        finally:
            close_old_connections()

    try:
        return await sync_to_async(run, thread_sensitive=False)()
    except Exception:
        # NOTE: a broken index must not cost the user their answer; it is logged and repaired
        # at the next start (retrieval.consistency).
        logger.exception("retrieval failed; answering without sources")
        return []


async def _read(stream: AsyncIterator[Delta | Usage], answer: Answer) -> AsyncIterator[str]:
    """Text deltas of `stream` (the engine's or a remote one), recording tokens, finish reason
    and usage into `answer`."""
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
    except (RequestFailedError, EngineClosedError, RemoteStreamError) as error:
        logger.warning("chat request ended by its backend: %s", error)
        is_abort = isinstance(error, EngineClosedError) or getattr(error, "is_abort", False)
        answer.finish_reason = "abort" if is_abort else "error"


def _finish_reason(answer: Answer, control: TurnControl) -> str:
    if control.is_stopped and answer.finish_reason in (None, "abort"):
        return "stopped"
    return answer.finish_reason or "stopped"


def _history_turn(message: Turn | Message, model_name: str) -> Turn:
    if isinstance(message, Turn):
        return message
    if message.role == Message.Role.USER:
        return Turn("user", message.prompt_content or message.content)
    # NOTE: the model's own token ids keep the cached prefix exact; another model's ids are not
    # ours to reuse, so its text is tokenized afresh.
    same_model = message.model == model_name and message.token_ids is not None
    return Turn("assistant", message.content, tuple(message.token_ids) if same_model else None)
