"""OpenAI-compatible endpoints: models, chat completions (with RAG), completions, embeddings.

Chat completions run through `chat.answer.answer_turn`, the same retrieve → prompt → stream path as
the browser chat, so API prompts get the cache-aware layout and `cached_tokens` in the usage.
Streams are server-sent events ending with `data: [DONE]`; a client that goes away mid-stream
aborts its engine request (Django cancels the response's iterator on disconnect).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from ninja import Router

from api import rate_limits
from api.documents import readable_collection_ids
from api.errors import ApiError
from api.logprobs import LogprobsWriter, requested_logprobs
from api.response_format import compile_on_local_engine, structured_output_of
from api.responses import (
    ENGINE_ABORTED,
    ENGINE_FAILED,
    engine_aborted,
    engine_or_503,
    event_stream,
    openai_finish_reason,
    settle,
    sse,
    usage_json,
    usage_of,
)
from api.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from api.tool_chat import tool_chat_completion, uses_tools
from backends.replicas import remote_models
from backends.routing import AUTO_MODEL, LOCAL_BACKEND
from chat.answer import Answer, TurnControl, TurnInput, answer_turn
from chat.delta_sources import cache_salt_for
from chat.errors import ChatError
from chat.events import TokenDelta
from chat.models import AssistantProfile
from inference import runtime
from inference.engine import (
    Delta,
    EngineClosedError,
    PromptTooLongError,
    RequestFailedError,
    SamplingParams,
    TokenLogprob,
    Usage,
)
from inference.models import ModelConfig
from inference.prompts import Turn
from retrieval.embedders import EmbedKind

logger = logging.getLogger(__name__)
router = Router(tags=["OpenAI-compatible"])

OWNED_BY = "cachet"
# ---- models ----


def embedding_model_name() -> str:
    name: str = settings.CACHET_EMBEDDING_MODEL
    return name


@sync_to_async
def chat_model_name() -> str:
    return runtime.engine_status()["model"] or runtime.served_model_name(ModelConfig.active())


remote_model_names = sync_to_async(remote_models)


@router.get("/models", summary="List the served models")
async def list_models(request: HttpRequest) -> dict:
    created = int(time.time())
    names = [
        await chat_model_name(),
        *await remote_model_names(),
        AUTO_MODEL,
        embedding_model_name(),
    ]
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": created, "owned_by": OWNED_BY}
            for name in dict.fromkeys(names)
        ],
    }


async def _check_model(requested: str) -> None:
    served = await chat_model_name()
    if requested != served:
        raise ApiError(
            404,
            f"The model `{requested}` does not exist; this server serves `{served}`.",
            code="model_not_found",
            param="model",
        )


async def _check_chat_model(requested: str) -> None:
    """Chat completions also take a remote backend's model, or `auto`: the routing rules
    (backends.routing), which answer locally while no remote backend is enabled."""
    if requested != AUTO_MODEL and requested not in await remote_model_names():
        await _check_model(requested)


# ---- sampling ----


def sampling_params(
    body: ChatCompletionRequest | CompletionRequest, max_tokens: int | None
) -> SamplingParams:
    if body.n not in (None, 1):
        raise ApiError(400, "Only n=1 is supported.", param="n")
    defaults = SamplingParams()
    cap = settings.CACHET_API_MAX_TOKENS
    if max_tokens is not None and max_tokens > cap:
        raise ApiError(400, f"max_tokens is at most {cap} on this server.", param="max_tokens")
    try:
        return SamplingParams(
            temperature=defaults.temperature if body.temperature is None else body.temperature,
            top_p=defaults.top_p if body.top_p is None else body.top_p,
            top_k=body.top_k,
            seed=body.seed,
            max_tokens=max_tokens or min(defaults.max_tokens, cap),
            stop=body.stop or (),
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            ignore_eos=body.ignore_eos,
            structured_output=structured_output_of(body.response_format),
            logprobs=requested_logprobs(body),
        )
    except ValueError as error:
        raise ApiError(400, str(error)) from None


# ---- chat completions ----


def _dialogue(messages) -> tuple[str | None, list[Turn], str]:
    """(system prompt or None, earlier turns, the newest user message)."""
    system = "\n\n".join(m.text for m in messages if m.role in ("system", "developer"))
    turns: list[list[str]] = []
    for message in messages:
        if message.role not in ("user", "assistant"):
            continue
        if turns and turns[-1][0] == message.role:
            turns[-1][1] += "\n\n" + message.text  # consecutive messages of one role: one turn
        else:
            turns.append([message.role, message.text])
    if not turns or turns[-1][0] != "user":
        raise ApiError(400, "The last message must have the role 'user'.", param="messages")
    if turns[0][0] != "user":
        raise ApiError(
            400, "The first non-system message must have the role 'user'.", param="messages"
        )
    history = [Turn(role, text) for role, text in turns[:-1]]
    return system or None, history, turns[-1][1]


@sync_to_async
def _default_system_prompt() -> str:
    return AssistantProfile.default().system_prompt


def _chat_error(error: ChatError) -> ApiError:
    if error.code == "context_overflow":
        return ApiError(400, error.message, code="context_length_exceeded", param="messages")
    if error.code == "engine_unavailable":
        return ApiError(503, error.message, code="model_loading", headers={"Retry-After": "5"})
    if error.code == "unknown_model":
        return ApiError(404, error.message, code="model_not_found", param="model")
    if error.code == "backend_unavailable":
        return ApiError(503, error.message, code=error.code, headers={"Retry-After": "5"})
    return ApiError(400, error.message, code=error.code)


@router.post("/chat/completions", summary="Create a chat completion (optionally with RAG)")
async def chat_completions(request: HttpRequest, body: ChatCompletionRequest):
    api_key = request.auth
    await _check_chat_model(body.model)
    await rate_limits.acheck_tokens(api_key)
    params = sampling_params(body, body.max_completion_tokens or body.max_tokens)
    if uses_tools(body):
        if body.model not in (AUTO_MODEL, await chat_model_name()):
            raise ApiError(
                400,
                f"Tool calls are answered by the local model `{await chat_model_name()}` (or "
                "`auto`); remote backends do not take them yet.",
                param="model",
            )
        engine, model_name = engine_or_503()
        return await tool_chat_completion(
            body, params, api_key, engine, model_name, await _default_system_prompt()
        )
    system_prompt, history, question = _dialogue(body.messages)
    if body.model == await chat_model_name():
        engine_or_503()  # refuse early when the model is loading or the server overloaded
    await compile_on_local_engine(params.structured_output)
    rag = body.rag
    turn = TurnInput(
        user=api_key.user,
        question=question,
        system_prompt=system_prompt or await _default_system_prompt(),
        params=params,
        history=history,
        collection_ids=await readable_collection_ids(api_key.user, rag.collections) if rag else [],
        search_top_k=rag.top_k if rag else None,
        # NOTE: without RAG the user's text goes to the model verbatim, as API clients expect.
        prompt_content=None if rag else question,
        request_id_prefix="api",
        cache_salt=cache_salt_for(api_key.user),
        requested_model=body.model,
    )
    answer, control = Answer(), TurnControl()
    events = answer_turn(turn, answer, control)
    try:
        await anext(events)  # SourcesFound: everything that can refuse the request has run
    except ChatError as error:
        raise _chat_error(error) from None
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return event_stream(
            _chat_stream(
                events, answer, params, api_key, completion_id, created, bool(rag), include_usage
            )
        )
    try:
        async with contextlib.aclosing(events):
            async for _ in events:
                pass
    finally:
        await settle(api_key, answer.usage, answer.num_prompt_tokens)
    if answer.finish_reason == "error":
        raise ApiError(500, "The engine failed while answering; retry.", code="engine_error")
    if answer.finish_reason == "abort":
        raise engine_aborted()
    body_json = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": answer.model_name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer.text},
                "logprobs": _answer_logprobs(answer, _logprobs_writer(params), answer.logprobs),
                "finish_reason": openai_finish_reason(answer.finish_reason),
            }
        ],
        "usage": _answer_usage(answer),
    }
    if rag:
        body_json["sources"] = answer.sources
    return JsonResponse(body_json)


def _logprobs_writer(params: SamplingParams) -> LogprobsWriter | None:
    """The writer of a request's logprobs (None: not asked for, or no local engine)."""
    if params.logprobs is None:
        return None
    try:
        engine, _ = runtime.get_engine_and_model()
    except runtime.EngineUnavailable:
        return None
    return LogprobsWriter(engine)


def _answer_logprobs(
    answer: Answer, writer: LogprobsWriter | None, logprobs: list[TokenLogprob]
) -> dict | None:
    """Chat logprobs of `logprobs` (some of the answer's), null unless asked for and answered by
    the local engine (remote backends are not asked for theirs)."""
    if writer is None or answer.backend != LOCAL_BACKEND:
        return None
    return writer.chat(logprobs)


def _answer_usage(answer: Answer) -> dict:
    usage = answer.usage
    if usage is None:
        return usage_json(answer.num_prompt_tokens, len(answer.token_ids), 0)
    return usage_of(usage)


async def _chat_stream(
    events,
    answer: Answer,
    params: SamplingParams,
    api_key,
    completion_id: str,
    created: int,
    rag: bool,
    usage: bool,
) -> AsyncIterator[str]:
    num_logprobs_sent = 0
    writer = _logprobs_writer(params)  # once: each chunk uses it

    def chunk(delta: dict, finish_reason: str | None = None, **extra) -> str:
        nonlocal num_logprobs_sent
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        if params.logprobs is not None:
            # NOTE: the tokens since the last chunk (a token's text may have been held back).
            new = answer.logprobs[num_logprobs_sent:]
            num_logprobs_sent = len(answer.logprobs)
            choice["logprobs"] = _answer_logprobs(answer, writer, new)
        return sse(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": answer.model_name,
                "choices": [choice],
                **extra,
            }
        )

    try:
        async with contextlib.aclosing(events):
            first = {"sources": answer.sources} if rag else {}
            yield chunk({"role": "assistant", "content": ""}, **first)
            async for event in events:
                if isinstance(event, TokenDelta):
                    yield chunk({"content": event.text})
        if answer.finish_reason == "error":
            yield sse(ENGINE_FAILED)
            return
        if answer.finish_reason == "abort":
            yield sse(ENGINE_ABORTED)
            return
        yield chunk({}, openai_finish_reason(answer.finish_reason))
        if usage:
            yield sse(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": answer.model_name,
                    "choices": [],
                    "usage": _answer_usage(answer),
                }
            )
        yield sse("[DONE]")
    finally:
        await asyncio.shield(settle(api_key, answer.usage, answer.num_prompt_tokens))


# ---- completions ----


@router.post("/completions", summary="Create a text completion")
async def completions(request: HttpRequest, body: CompletionRequest):
    api_key = request.auth
    await _check_model(body.model)
    await rate_limits.acheck_tokens(api_key)
    params = sampling_params(body, body.max_tokens)
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if body.stream and len(prompts) > 1:
        raise ApiError(400, "Streaming takes one prompt.", param="prompt")
    engine, model_name = engine_or_503()
    await compile_on_local_engine(params.structured_output)
    streams = []
    for prompt in prompts:
        if not prompt:
            raise ApiError(400, "A prompt must not be empty.", param="prompt")
        try:
            request_id = f"api-{uuid.uuid4().hex[:16]}"
            salt = cache_salt_for(api_key.user)
            streams.append(engine.stream(prompt, params, request_id=request_id, cache_salt=salt))
        except PromptTooLongError as error:
            raise ApiError(
                400, str(error), code="context_length_exceeded", param="prompt"
            ) from None
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    header = {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model_name,
    }
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        writer = LogprobsWriter(engine) if params.logprobs is not None else None
        return event_stream(_completion_stream(streams[0], header, api_key, include_usage, writer))
    results = await asyncio.gather(*(_collect(stream) for stream in streams))
    usages = [result.usage for result in results]
    for usage in usages:
        await settle(api_key, usage)
    if any(result.reason == "error" for result in results):
        raise ApiError(500, "The engine failed while answering; retry.", code="engine_error")
    if any(result.reason == "abort" for result in results):
        raise engine_aborted()
    writer = LogprobsWriter(engine)
    return JsonResponse(
        {
            **header,
            "choices": [
                _completion_choice(
                    i,
                    result.text,
                    openai_finish_reason(result.reason),
                    writer.completion(result.logprobs) if params.logprobs is not None else None,
                )
                for i, result in enumerate(results)
            ],
            "usage": usage_json(
                sum(u.prompt_tokens for u in usages if u),
                sum(u.completion_tokens for u in usages if u),
                sum(u.cached_tokens for u in usages if u),
            ),
        }
    )


def _completion_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict | None = None
) -> dict:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}


@dataclass(slots=True)
class _Collected:
    text: str = ""
    reason: str | None = None
    usage: Usage | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


async def _collect(stream) -> _Collected:
    collected, parts = _Collected(), []
    try:
        async for item in stream:
            if isinstance(item, Delta):
                parts.append(item.text)
                collected.logprobs.extend(item.logprobs)
                collected.reason = item.finish_reason or collected.reason
            else:
                collected.usage = item
    except RequestFailedError:
        collected.reason = "error"
    except EngineClosedError:  # shut down between taking the engine and queueing on it
        collected.reason = "abort"
    collected.text = "".join(parts)
    return collected


async def _completion_stream(
    stream, header: dict, api_key, include_usage: bool, writer: LogprobsWriter | None
):
    usage = None
    logprobs: list[TokenLogprob] = []  # of tokens whose text is not sent yet
    text_offset = 0
    try:
        try:
            async for item in stream:
                if isinstance(item, Usage):
                    usage = item
                    continue
                if item.finish_reason == "abort":
                    yield sse(ENGINE_ABORTED)
                    return
                logprobs.extend(item.logprobs)
                if item.text or item.finish_reason:
                    reason = (
                        openai_finish_reason(item.finish_reason) if item.finish_reason else None
                    )
                    chunk_logprobs = None
                    if writer is not None:
                        chunk_logprobs = writer.completion(logprobs, text_offset)
                        logprobs = []
                    text_offset += len(item.text)
                    choice = _completion_choice(0, item.text, reason, chunk_logprobs)
                    yield sse({**header, "choices": [choice]})
        except RequestFailedError:
            yield sse(ENGINE_FAILED)
            return
        except EngineClosedError:
            yield sse(ENGINE_ABORTED)
            return
        if include_usage and usage is not None:
            yield sse({**header, "choices": [], "usage": usage_of(usage)})
        yield sse("[DONE]")
    finally:
        await stream.aclose()  # a vanished client: abort the engine request now
        await asyncio.shield(settle(api_key, usage))


# ---- embeddings ----


@router.post("/embeddings", summary="Create embeddings")
async def embeddings(request: HttpRequest, body: EmbeddingRequest):
    api_key = request.auth
    if body.model != embedding_model_name():
        raise ApiError(
            404,
            f"The model `{body.model}` does not exist; the embedding model is "
            f"`{embedding_model_name()}`.",
            code="model_not_found",
            param="model",
        )
    texts = [body.input] if isinstance(body.input, str) else body.input
    vectors, num_tokens = await sync_to_async(_embed, thread_sensitive=False)(
        texts, body.input_type or "passage"
    )
    await settle(api_key, Usage("embeddings", num_tokens, 0, 0, None, 0.0, 0.0))
    as_base64 = body.encoding_format == "base64"  # the official client's default
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": (
                    base64.b64encode(vector.astype("<f4").tobytes()).decode()
                    if as_base64
                    else vector.tolist()
                ),
            }
            for i, vector in enumerate(vectors)
        ],
        "model": body.model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def _embed(texts: list[str], kind: EmbedKind):
    from retrieval.embeddings import get_embedder

    embedder = get_embedder()
    num_tokens = sum(len(ids) for ids in embedder.tokenizer(texts)["input_ids"])
    return embedder.encode(texts, kind=kind), num_tokens
