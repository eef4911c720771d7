"""The two sources of an answer's deltas: the in-process engine and a remote backend.

Both yield the engine's `Delta`s then one `Usage` (backends.client maps a remote stream onto
them), so the answer loop (chat.answer) reads either the same way. A source also says who
answered, how to abort and close it, and which trailing token ids are not part of the answer.
Opening one is where it can refuse the turn with a `ChatError`: the engine not loaded, a prompt
too long, a backend that refuses the request. A remote answer keeps no token ids: they are
another model's, not ours to replay.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings

from backends import metrics as backend_metrics
from backends.client import RemoteRequestError, RemoteStream
from backends.replicas import NoReplicaAvailable, open_stream
from backends.routing import LOCAL_BACKEND, Route
from chat.errors import ChatError
from inference import runtime
from inference.engine import Delta, Engine, SamplingParams, Usage
from inference.models import ModelConfig
from inference.prompts import BuiltPrompt, PromptBuilder

logger = logging.getLogger(__name__)

MAX_BUILDERS_PER_ENGINE = 64
_builders: weakref.WeakKeyDictionary[Engine, dict[str, PromptBuilder]] = weakref.WeakKeyDictionary()
_builders_lock = threading.Lock()


class DeltaSource(Protocol):
    @property
    def backend(self) -> str:
        """Who answers: LOCAL_BACKEND or an InferenceBackend's name."""

    @property
    def model_name(self) -> str: ...

    @property
    def num_prompt_tokens(self) -> int:
        """The prompt's length when known before the usage arrives; else 0."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end an answer and are not kept at its end."""

    @property
    def deltas(self) -> AsyncIterator[Delta | Usage]: ...

    def abort(self) -> None:
        """Stop the request now, from any task."""

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class EngineSource:
    engine: Engine
    request_id: str
    deltas: AsyncGenerator[Delta | Usage, None]
    model_name: str
    num_prompt_tokens: int
    backend: str = LOCAL_BACKEND

    @property
    def eos_token_ids(self) -> frozenset[int]:
        # NOTE: the chat template closes an answer itself; an eos kept in it would appear twice.
        return self.engine.eos_token_ids

    def abort(self) -> None:
        self.engine.abort(self.request_id)  # frees the request's KV blocks at once

    async def aclose(self) -> None:
        await self.deltas.aclose()  # aborts the request if it still runs; else nothing


@dataclass(slots=True)
class RemoteSource:
    stream: RemoteStream
    num_prompt_tokens: int = 0  # the remote's usage counts them
    eos_token_ids: frozenset[int] = frozenset()  # no token ids are kept

    @property
    def backend(self) -> str:
        return self.stream.backend.name

    @property
    def model_name(self) -> str:
        return self.stream.payload["model"]

    @property
    def deltas(self) -> RemoteStream:
        return self.stream

    def abort(self) -> None:
        self.stream.abort()  # closing the stream is how a remote request is cancelled

    async def aclose(self) -> None:
        await self.stream.aclose()  # the remote server aborts a request whose stream is closed


def local_engine() -> tuple[Engine, str]:
    """The in-process engine with its model's name; ChatError `engine_unavailable` while it
    cannot take requests (loading, or its last load failed)."""
    try:
        return runtime.get_engine_and_model()
    except runtime.EngineUnavailable as error:
        backend_metrics.record_unavailable(LOCAL_BACKEND)
        raise ChatError("engine_unavailable", str(error)) from error


def local_model_name() -> str:
    """The in-process engine's model name, also while it loads."""
    return runtime.engine_status()["model"] or runtime.served_model_name(ModelConfig.active())


def prompt_builder_for(engine: Engine, system_prompt: str) -> PromptBuilder:
    """A builder for this engine's tokenizer and context, kept per system prompt."""
    with _builders_lock:
        builders = _builders.setdefault(engine, {})
        builder = builders.get(system_prompt)
        if builder is None:
            if len(builders) >= MAX_BUILDERS_PER_ENGINE:
                builders.pop(next(iter(builders)))
            builder = PromptBuilder(
                engine.tokenizer,
                system_prompt,
                max_model_len=engine.max_model_len,
                tokenizer_lock=engine.tokenizer_lock,
            )
            builders[system_prompt] = builder
        return builder


def cache_salt_for(user) -> str | None:
    """The prefix-cache salt of `user`'s requests: None shares cached blocks between users."""
    if settings.CACHET_CACHE_ISOLATION == "user":
        return f"user:{user.pk}"
    return None


def start_on_engine(
    engine: Engine,
    model_name: str,
    prompt: BuiltPrompt,
    params: SamplingParams,
    *,
    request_id: str,
    cache_salt: str | None,
) -> EngineSource:
    """The engine's stream of `prompt`; bad input (a prompt too long) raises ValueError here."""
    deltas = engine.stream(
        prompt.token_ids,
        params,
        request_id=request_id,
        cache_salt=cache_salt,
        reusable=prompt.reusable,
    )
    return EngineSource(engine, request_id, deltas, model_name, len(prompt.token_ids))


async def open_remote(
    route: Route, messages: list[dict], params: SamplingParams, request_id: str
) -> RemoteSource | None:
    """The opened stream of `route`'s model (failing over between its replicas), or None when
    no replica can take the turn and the route may fall back to the in-process engine."""
    try:
        stream = await open_stream(route.model, messages, params, request_id)
    except RemoteRequestError as error:
        if error.code == "context_length_exceeded":
            raise ChatError("context_overflow", error.message) from None
        raise ChatError("backend_refused", f"the backend refused the request: {error}") from None
    except NoReplicaAvailable as error:
        backend_metrics.record_unavailable(route.model)
        if not route.may_fall_back:
            raise ChatError("backend_unavailable", str(error)) from None
        logger.warning("%s; the in-process engine answers instead", error)
        return None
    return RemoteSource(stream)
