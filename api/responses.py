"""Pieces every OpenAI-compatible response is made of: the engine (or a 503), finish reasons,
usage in both vocabularies, the key's accounting, server-sent events and the engine's errors."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from django.conf import settings
from django.http import StreamingHttpResponse

from api import keys, rate_limits
from api.errors import ApiError
from inference import runtime
from inference.engine import Engine, Usage

logger = logging.getLogger(__name__)

ENGINE_FAILED = {
    "error": {
        "message": "The engine failed while answering; retry.",
        "type": "server_error",
        "param": None,
        "code": "engine_error",
    }
}
# NOTE: the engine aborts a request the client did not stop when it shuts down: the model was
# reloaded and the request outlived the old engine's drain period, or the server is stopping.
# OpenAI has no finish reason for that; a truncated answer ending in "stop" would look whole.
ENGINE_ABORTED_MESSAGE = (
    "The server ended this request before it finished (the model was reloaded, or the server "
    "is stopping); retry."
)
ENGINE_ABORTED = {
    "error": {
        "message": ENGINE_ABORTED_MESSAGE,
        "type": "server_error",
        "param": None,
        "code": "engine_restarted",
    }
}


def engine_aborted() -> ApiError:
    return ApiError(
        503, ENGINE_ABORTED_MESSAGE, code="engine_restarted", headers={"Retry-After": "1"}
    )


def engine_or_503() -> tuple[Engine, str]:
    try:
        engine, model_name = runtime.get_engine_and_model()
    except runtime.EngineUnavailable as error:
        raise ApiError(
            503, str(error), code="model_loading", headers={"Retry-After": "5"}
        ) from None
    if engine.num_unfinished_requests() >= settings.CACHET_API_MAX_PENDING:
        raise ApiError(
            503,
            "The server is overloaded; retry shortly.",
            code="overloaded",
            headers={"Retry-After": "1"},
        )
    return engine, model_name


def openai_finish_reason(reason: str | None) -> str:
    # NOTE: OpenAI knows "stop" and "length"; an aborted request ends like a stopped one.
    return "length" if reason == "length" else "stop"


def usage_of(usage: Usage | None, fallback_prompt_tokens: int = 0) -> dict:
    """`usage_json` of a request's Usage; without one (it ended before any), the prompt only."""
    if usage is None:
        return usage_json(fallback_prompt_tokens, 0, 0)
    return usage_json(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def usage_json(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """OpenAI's usage, with the prefix-cache hits also in DeepSeek's words (hit + miss = prompt),
    which the cache-aware client code of the inference-cost literature reads."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
        "prompt_cache_hit_tokens": cached_tokens,
        "prompt_cache_miss_tokens": prompt_tokens - cached_tokens,
    }


async def settle(api_key, usage: Usage | None, fallback_prompt_tokens: int = 0) -> None:
    """Count the request's tokens against the key's budget and usage, whatever happened."""
    prompt_tokens = usage.prompt_tokens if usage else fallback_prompt_tokens
    completion_tokens = usage.completion_tokens if usage else 0
    try:
        await rate_limits.acharge_tokens(api_key, prompt_tokens + completion_tokens)
        await keys.arecord_usage(api_key, prompt_tokens, completion_tokens, num_requests=0)
    except Exception:  # accounting must never turn a served answer into an error
        logger.exception("could not record the usage of API key %s", api_key.pk)


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def event_stream(events: AsyncIterator[str]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event through at once
    return response
