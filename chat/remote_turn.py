"""The routing side of a chat turn: choose its backend, and answer it on a remote one.

`choose_turn_route` applies backends.routing's rules to a turn (the local model's name, the
enabled backends, the turn's size). `open_remote_answer` lays out the newest user turn as for
the engine (passages quoted once, today's facts), sends the conversation as OpenAI messages to a
replica of the route's model (failing over between replicas), and returns the opened stream.
A remote answer keeps no token ids: they are another model's, not ours to replay.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.conf import settings

from backends.client import RemoteRequestError, RemoteStream
from backends.models import InferenceBackend
from backends.replicas import open_stream
from backends.routing import (
    Route,
    RoutingPolicy,
    TurnShape,
    UnknownModelError,
    choose_route,
    complex_model_of,
)
from chat.errors import ChatError
from inference import runtime
from inference.models import ModelConfig


def local_model_name() -> str:
    """The in-process engine's model name, also while it loads."""
    return runtime.engine_status()["model"] or runtime.served_model_name(ModelConfig.active())


def routing_policy() -> RoutingPolicy:
    backends = list(InferenceBackend.objects.filter(is_enabled=True))
    return RoutingPolicy(
        local_model=local_model_name(),
        remote_models=sorted({backend.model for backend in backends}),
        complex_model=complex_model_of(backends),
        long_prompt_chars=settings.CACHET_ROUTE_PROMPT_CHARS,
        many_passages=settings.CACHET_ROUTE_PASSAGES,
    )


@database_sync_to_async
def choose_turn_route(shape: TurnShape) -> Route:
    """The route of a turn; an unknown explicit model is a ChatError `unknown_model`."""
    try:
        return choose_route(shape, routing_policy())
    except UnknownModelError as error:
        raise ChatError("unknown_model", str(error)) from None


def chat_messages(system_prompt: str, history: list, user_turn: str) -> list[dict]:
    """OpenAI messages: the system prompt, earlier turns (as `Turn`s), the newest user turn."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += [{"role": turn.role, "content": turn.content} for turn in history]
    messages.append({"role": "user", "content": user_turn})
    return messages


async def open_remote_answer(
    route: Route, messages: list[dict], params, request_id: str
) -> RemoteStream:
    """The opened stream of `route`'s model (failing over between its replicas).

    A request the backend refuses is a ChatError; `NoReplicaAvailable` is left to the caller,
    which may fall back to the in-process engine.
    """
    try:
        return await open_stream(route.model, messages, params, request_id)
    except RemoteRequestError as error:
        if error.code == "context_length_exceeded":
            raise ChatError("context_overflow", error.message) from None
        raise ChatError("backend_refused", f"the backend refused the request: {error}") from None
