"""The answer loop: one answer, from the question to its last delta, for the chat and the API.

retrieve → route (backends.routing) → lay out the prompt (chat.prompt) → open a source of deltas
(chat.delta_sources: the in-process engine, or a remote backend) → stream it into an `Answer`.
`answer_turn` yields `SourcesFound` once, then `TokenDelta`s; saving is the caller's (chat.turn
saves to a conversation, the REST API saves nothing). Problems a client can act on raise
`ChatError` (docs/chat-protocol.md) before `SourcesFound`; afterwards every ending — done,
stopped, closed early, engine or backend failure — leaves the answer with a finish reason and
frees the request.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import close_old_connections
from django.utils import timezone

from backends import metrics as backend_metrics
from backends.client import RemoteStreamError
from backends.routing import (
    LOCAL_BACKEND,
    ProfileRouting,
    Route,
    TurnShape,
    UnknownModelError,
    choose_route,
    routing_policy,
)
from chat import delta_sources
from chat.delta_sources import DeltaSource
from chat.errors import ChatError
from chat.events import AnswerEvent, SourcesFound, TokenDelta
from chat.models import Message
from chat.prompt import (
    UserTurn,
    build_with_passages,
    chat_messages,
    history_chars,
    history_turns,
    lay_out_user_turn,
)
from inference.engine import (
    Delta,
    EngineClosedError,
    RequestFailedError,
    SamplingParams,
    StructuredOutputError,
    TokenLogprob,
    Usage,
)
from inference.prompts import Turn
from retrieval.search import SearchHit, search

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class TurnInput:
    """What one answer is made from, wherever the question came from (chat or REST API).

    `history` holds earlier turns, oldest first, alternating user/assistant: `Turn`s, or saved
    `Message`s (whose answers replay the model's own token ids). `prompt_content` is the newest
    user turn as the model saw it, when known (regenerating); otherwise it is laid out from the
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
    is_started: bool = False  # reached a backend: there is something to save
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when the params asked (local)
    finish_reason: str | None = None
    usage: Usage | None = None
    backend: str = LOCAL_BACKEND  # who answered: "local" or an InferenceBackend's name
    route: str = ""  # the routing rule that chose it (backends.routing), or "fallback"

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


@dataclass(slots=True)
class TurnControl:
    """Lets another task stop the turn; the partial answer is saved as "stopped"."""

    is_stopped: bool = False
    _source: DeltaSource | None = None

    def stop(self) -> None:
        self.is_stopped = True
        if self._source is not None:
            self._source.abort()

    def attach(self, source: DeltaSource) -> None:
        self._source = source


async def answer_turn(
    turn: TurnInput, answer: Answer, control: TurnControl | None = None
) -> AsyncIterator[AnswerEvent]:
    """Retrieve, lay out the prompt, and stream the answer into `answer` (see the module doc).

    `answer.backend` and `answer.route` say who answered and why.
    """
    control = control or TurnControl()
    hits = await _retrieve(turn) if turn.prompt_content is None else []
    route = await choose_turn_route(_shape_of(turn, hits))
    answer.route = route.reason
    source = await _open_remote(turn, hits, answer, route) if route.is_remote else None
    if source is None:
        if route.is_remote:
            answer.route = "fallback"
        source = await _open_engine(turn, hits, answer)
    answer.backend, answer.model_name = source.backend, source.model_name
    answer.num_prompt_tokens = source.num_prompt_tokens
    answer.is_started = True
    control.attach(source)
    backend_metrics.record_route(answer.backend, answer.route)
    # NOTE: sources come after everything that can refuse the turn, so a caller that waits for
    # them (the REST API) can still answer a refusal with its own status code.
    yield SourcesFound(answer.sources)
    try:
        # NOTE: the engine queues a request on its stream's first step, so a turn stopped before
        # this point never reaches it.
        if not control.is_stopped:
            async for text in _read(source.deltas, answer):
                yield TokenDelta(text)
    finally:
        if answer.finish_reason is None:
            control.stop()  # the client went away mid-answer: free the request now
        await source.aclose()
        answer.finish_reason = _finish_reason(answer, control)
        while answer.token_ids and answer.token_ids[-1] in source.eos_token_ids:
            answer.token_ids.pop()
        backend_metrics.record_request(answer.backend, answer.finish_reason)


@database_sync_to_async
def choose_turn_route(shape: TurnShape) -> Route:
    """The route of a turn; an unknown explicit model is a ChatError `unknown_model`."""
    try:
        return choose_route(shape, routing_policy(delta_sources.local_model_name()))
    except UnknownModelError as error:
        raise ChatError("unknown_model", str(error)) from None


async def _open_remote(
    turn: TurnInput, hits: list[SearchHit], answer: Answer, route: Route
) -> DeltaSource | None:
    if turn.prompt_content is None:
        # NOTE: the whole history is sent; a remote model's context is the remote's concern
        # (an overflow comes back as context_overflow).
        user_turn = lay_out_user_turn(
            turn.question, hits, turn.history, user_name=_name_of(turn.user), today=_today()
        )
    else:
        user_turn = UserTurn(turn.prompt_content, turn.sources)
    answer.prompt_content, answer.sources = user_turn.text, user_turn.sources
    history = history_turns(turn.history, route.model)
    messages = chat_messages(turn.system_prompt, history, user_turn.text)
    return await delta_sources.open_remote(route, messages, turn.params, _request_id(turn))


async def _open_engine(turn: TurnInput, hits: list[SearchHit], answer: Answer) -> DeltaSource:
    engine, model_name = delta_sources.local_engine()
    builder = delta_sources.prompt_builder_for(engine, turn.system_prompt)
    max_tokens = turn.params.max_tokens or 1
    try:
        if turn.prompt_content is None:
            prompt, user_turn = await sync_to_async(build_with_passages, thread_sensitive=False)(
                builder,
                turn.question,
                hits,
                turn.history,
                model_name=model_name,
                user_name=_name_of(turn.user),
                today=_today(),
                max_tokens=max_tokens,
            )
        else:
            user_turn = UserTurn(turn.prompt_content, turn.sources)
            history = history_turns(turn.history, model_name)
            prompt = await sync_to_async(builder.build, thread_sensitive=False)(
                history, user_turn.text, max_tokens=max_tokens
            )
        source = delta_sources.start_on_engine(
            engine,
            model_name,
            prompt,
            turn.params,
            request_id=_request_id(turn),
            cache_salt=turn.cache_salt,
        )
    except StructuredOutputError as error:  # a grammar that would not compile: before queueing
        raise ChatError("invalid_response_format", str(error)) from error
    except ValueError as error:  # ContextOverflowError, PromptTooLongError: before queueing
        raise ChatError("context_overflow", str(error)) from error
    answer.prompt_content, answer.sources = user_turn.text, user_turn.sources
    return source


def _shape_of(turn: TurnInput, hits: list[SearchHit]) -> TurnShape:
    """What the routing rules see: the turn's size in characters and passages."""
    if turn.prompt_content is None:
        newest_chars = len(turn.question) + sum(len(hit.text) for hit in hits)
        num_passages = len(hits)
    else:
        newest_chars, num_passages = len(turn.prompt_content), len(turn.sources)
    return TurnShape(
        requested_model=turn.requested_model,
        profile_routing=turn.profile_routing,
        prompt_chars=history_chars(turn.history) + newest_chars,
        num_passages=num_passages,
    )


async def _retrieve(turn: TurnInput) -> list[SearchHit]:
    if not turn.collection_ids:
        return []
    top_k = turn.search_top_k or settings.CACHET_SEARCH_TOP_K

    def run() -> list[SearchHit]:
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
    """Text deltas of `stream` (either source's), recording tokens, finish reason and usage
    into `answer`."""
    try:
        async for item in stream:
            if isinstance(item, Delta):
                answer.token_ids.extend(item.token_ids)
                answer.logprobs.extend(item.logprobs)
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


def _request_id(turn: TurnInput) -> str:
    return f"{turn.request_id_prefix}-{uuid.uuid4().hex[:16]}"


def _name_of(user: AbstractBaseUser) -> str:
    return user.get_full_name() or user.get_username()


def _today() -> datetime.date:
    return timezone.localdate()
