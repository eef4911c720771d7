"""One streamed chat completion on a remote OpenAI-compatible endpoint, over httpx.

`RemoteStream.open()` sends the request and waits for the response headers. A replica that cannot
take the request (unreachable, timing out, 5xx, 429, our key refused, the model missing) raises
`BackendUnavailable`, so the caller fails over to another replica; a request the endpoint refuses
as such (400: too long, a bad value) raises `RemoteRequestError`, which another replica would
refuse too. Iterating yields the engine's own `Delta` and `Usage` items, so a chat turn reads a
remote answer exactly like a local one; the usage maps `prompt_tokens_details.cached_tokens`.

`abort()` (from any task) or `aclose()` closes the connection, which is how a client cancels an
OpenAI stream: vLLM and Cachet both abort the request when its client goes away. A stream that
broke after it had started (the connection lost, the remote silent too long) keeps why in
`failure`; `on_close`, awaited once when the stream is closed, lets the router count the
request finished and mark a replica that broke down (backends.replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from backends.models import InferenceBackend
from inference.engine import Delta, SamplingParams, StructuredOutput, Usage

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
MAX_ERROR_BODY_CHARS = 500
# Statuses after which another replica may well succeed: overloaded, failing, or misconfigured
# (our key refused, the model not served there).
FAILOVER_STATUSES = frozenset({401, 403, 404, 408, 409, 429}) | frozenset(range(500, 600))
OPENAI_FINISH_REASONS = frozenset({"stop", "length"})


class BackendUnavailable(RuntimeError):
    """This replica cannot take the request now; another one may."""


class RemoteRequestError(RuntimeError):
    """The endpoint refused the request itself (HTTP 400-class); retrying elsewhere won't help."""

    def __init__(self, status: int, code: str | None, message: str):
        super().__init__(f"HTTP {status} ({code or 'no code'}): {message}")
        self.status, self.code, self.message = status, code, message


class RemoteStreamError(RuntimeError):
    """The stream broke or reported an error after it had started."""

    def __init__(self, message: str, *, is_abort: bool = False):
        super().__init__(message)
        self.is_abort = is_abort  # the remote ended the request itself (reload, shutdown)


def chat_payload(model: str, messages: list[dict], params: SamplingParams) -> dict:
    """An OpenAI chat-completions body for `params`; extensions only when they are in use."""
    payload = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if params.max_tokens is not None:
        payload["max_tokens"] = params.max_tokens
    if params.seed is not None:
        payload["seed"] = params.seed
    if params.stop:
        payload["stop"] = list(params.stop)
    if params.presence_penalty:
        payload["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty:
        payload["frequency_penalty"] = params.frequency_penalty
    # NOTE: vLLM and Cachet accept these extensions; OpenAI itself would refuse them, so they are
    # sent only when set.
    if params.top_k is not None:
        payload["top_k"] = params.top_k
    if params.ignore_eos:
        payload["ignore_eos"] = True
    if params.structured_output is not None:
        payload["response_format"] = response_format_json(params.structured_output)
    return payload


def response_format_json(output: StructuredOutput) -> dict:
    """OpenAI's `response_format` for a structured output (vLLM serves both kinds)."""
    if output.kind == "json":
        return {"type": "json_object"}
    if output.kind != "json_schema":
        raise ValueError(f"a {output.kind} structured output has no response_format")
    schema = {"name": "output", "schema": json.loads(output.spec), "strict": output.strict}
    return {"type": "json_schema", "json_schema": schema}


def auth_headers(backend: InferenceBackend) -> dict[str, str]:
    return {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}


def usage_from_json(
    request_id: str, usage: dict, *, ttft_s: float | None, decode_s: float, total_s: float
) -> Usage:
    """The engine's `Usage` from an OpenAI usage object (or one that counts its cache hits in
    DeepSeek's `prompt_cache_hit_tokens` only), with timings measured here."""
    details = usage.get("prompt_tokens_details") or {}
    completion_tokens = int(usage.get("completion_tokens") or 0)
    tokens_per_s = (completion_tokens - 1) / decode_s if completion_tokens > 1 and decode_s else 0.0
    return Usage(
        request_id=request_id,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(
            details.get("cached_tokens") or usage.get("prompt_cache_hit_tokens") or 0
        ),
        completion_tokens=completion_tokens,
        ttft_s=ttft_s,
        tokens_per_s=tokens_per_s,
        total_s=total_s,
    )


class RemoteStream:
    """`await open()`, then `async for item in stream`, then `await aclose()` (see module doc)."""

    def __init__(
        self, backend: InferenceBackend, payload: dict, request_id: str, *, timeout_s: float
    ) -> None:
        self.backend = backend
        self.payload = payload
        self.request_id = request_id
        self.timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None
        self._response: httpx.Response | None = None
        self._stopped = asyncio.Event()
        self._started = time.monotonic()
        self._is_closed = False
        self.failure: str | None = None  # why the stream broke after it had started
        self.on_close: Callable[[RemoteStream], Awaitable[None]] | None = None

    async def open(self) -> None:
        # NOTE: a client per request: closing its one connection is what aborts the request on
        # the remote side, and a client must not outlive the event loop it was made in.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout_s, connect=CONNECT_TIMEOUT_S)
        )
        url = self.backend.chat_completions_url
        headers = {
            **auth_headers(self.backend),
            "Accept": "text/event-stream",
            "X-Request-Id": self.request_id,
        }
        request = self._client.build_request("POST", url, json=self.payload, headers=headers)
        self._started = time.monotonic()
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as error:
            await self.aclose()
            raise BackendUnavailable(f"{url}: {type(error).__name__}: {error}") from None
        except BaseException:  # cancelled while connecting: leave no connection behind
            await self.aclose()
            raise
        self._response = response
        if response.status_code == 200:
            return
        body = (await response.aread()).decode(errors="replace")
        await self.aclose()
        code, message = _error_of(body)
        if response.status_code in FAILOVER_STATUSES:
            raise BackendUnavailable(f"{url}: HTTP {response.status_code}: {message}")
        raise RemoteRequestError(response.status_code, code, message)

    def abort(self) -> None:
        """Stop reading; the stream's iterator closes the connection (any task may call this)."""
        self._stopped.set()

    async def aclose(self) -> None:
        if self._response is not None:
            with contextlib.suppress(Exception):
                await self._response.aclose()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
        if not self._is_closed:
            self._is_closed = True
            if self.on_close is not None:
                await self.on_close(self)

    async def __aiter__(self) -> AsyncIterator[Delta | Usage]:
        if self._response is None:
            raise RuntimeError("open() the stream first")
        first_token_at = last_token_at = None
        usage = None
        try:
            async for data in self._events():
                if data == "[DONE]":
                    break
                chunk = _json_of(data)
                if "error" in chunk:
                    error = chunk["error"] or {}
                    raise RemoteStreamError(
                        f"{self.backend.name}: {error.get('message', 'error')}",
                        is_abort=error.get("code") == "engine_restarted",
                    )
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or ""
                    reason = choice.get("finish_reason")
                    if text:
                        last_token_at = time.monotonic()
                        first_token_at = first_token_at or last_token_at
                    if text or reason:
                        finish = None
                        if reason:
                            finish = reason if reason in OPENAI_FINISH_REASONS else "stop"
                        yield Delta(self.request_id, text, (), finish)
        except httpx.HTTPError as error:
            self.failure = f"the stream broke: {type(error).__name__}: {error}"
            raise RemoteStreamError(f"{self.backend.name}: {self.failure}") from None
        finally:
            await self.aclose()
        if usage is not None:
            now = time.monotonic()
            yield usage_from_json(
                self.request_id,
                usage,
                ttft_s=first_token_at - self._started if first_token_at else None,
                decode_s=(last_token_at - first_token_at) if first_token_at else 0.0,
                total_s=now - self._started,
            )

    async def _events(self) -> AsyncIterator[str]:
        """The `data:` payloads of the server-sent events, until the end or `abort()`."""
        lines = aiter(self._response.aiter_lines())
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            while True:
                next_line = asyncio.ensure_future(anext(lines))
                await asyncio.wait({next_line, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not next_line.done():  # aborted while waiting for the remote
                    next_line.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await next_line
                    return
                try:
                    line = next_line.result()
                except StopAsyncIteration:
                    return
                if line.startswith("data:"):
                    yield line[5:].strip()
                if self._stopped.is_set():
                    return
        finally:
            stopped.cancel()


def _json_of(data: str) -> dict:
    try:
        value = json.loads(data)
    except ValueError:
        raise RemoteStreamError(f"not JSON in the stream: {data[:100]!r}") from None
    if not isinstance(value, dict):
        raise RemoteStreamError(f"not a JSON object in the stream: {data[:100]!r}")
    return value


def _error_of(body: str) -> tuple[str | None, str]:
    """(code, message) of an OpenAI-shaped error body, or its text."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        return error.get("code"), str(error.get("message") or "")[:MAX_ERROR_BODY_CHARS]
    return None, body[:MAX_ERROR_BODY_CHARS] or "(empty body)"
