"""Chat completions with tools: the conversation through the model's own chat template, the
answer under the tool-call grammar, and its calls parsed back into OpenAI's `tool_calls`.

A request takes this path when it offers tools (and tool_choice is not "none") or its history
holds calls or tool results. Such a conversation is rendered whole by the chat template (which
lays out the tool definitions, earlier calls and their results as the model was trained on),
answered by the local engine, and split by `inference.tool_calls.ToolCallParser` into content and
calls, streamed as deltas or returned whole. Everything that can refuse the request (tools, the
tool choice, a tool message answering no call, a template without tool calls, an over-long
prompt) is a 400 before anything is queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.http import JsonResponse

from api.errors import ApiError
from api.response_format import compile_grammar
from api.responses import (
    ENGINE_ABORTED,
    ENGINE_FAILED,
    engine_aborted,
    event_stream,
    openai_finish_reason,
    settle,
    sse,
    usage_of,
)
from api.schemas import ChatCompletionRequest, ChatMessage
from chat.delta_sources import cache_salt_for
from inference.engine import (
    Delta,
    Engine,
    EngineClosedError,
    PromptTooLongError,
    RequestFailedError,
    SamplingParams,
    Usage,
)
from inference.tool_calls import (
    ToolCall,
    ToolCallError,
    ToolCallParser,
    named_tool_choice,
    normalized_tools,
    supports_tool_calls,
    tool_call_output,
)


def uses_tools(body: ChatCompletionRequest) -> bool:
    """Whether a chat request needs the tool path (see the module doc)."""
    offers_tools = bool(body.tools) and body.tool_choice != "none"
    return offers_tools or any(m.role == "tool" or m.tool_calls for m in body.messages)


def tool_params(
    body: ChatCompletionRequest, params: SamplingParams
) -> tuple[list[dict], SamplingParams]:
    """The checked tools, and `params` with the tool-call grammar (none for tool_choice "none")."""
    try:
        tools = normalized_tools(body.tools or [])
        named_tool_choice(body.tool_choice, tools)
    except ToolCallError as error:
        raise ApiError(400, str(error), param=error.param) from None
    if body.tool_choice == "none" or not tools:
        return tools, params
    if params.structured_output is not None:
        raise ApiError(
            400, "response_format cannot be combined with tools; use one.", param="response_format"
        )
    output = tool_call_output(
        tools, body.tool_choice, parallel=body.parallel_tool_calls is not False
    )
    return tools, dataclasses.replace(params, structured_output=output)


def template_messages(messages: list[ChatMessage], default_system_prompt: str) -> list[dict]:
    """The conversation as a chat template takes it: one system message first, calls with their
    arguments as objects, each tool result after the call it answers."""
    system = "\n\n".join(m.text for m in messages if m.role in ("system", "developer"))
    rendered: list[dict[str, Any]] = [
        {"role": "system", "content": system or default_system_prompt}
    ]
    open_call_ids: set[str] = set()
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if message.role in ("system", "developer"):
            continue
        if message.role == "tool":
            if message.tool_call_id not in open_call_ids:
                raise ApiError(
                    400,
                    f"{where}: a tool message must answer a call of an earlier assistant message "
                    f"by its id; tool_call_id {message.tool_call_id!r} answers none.",
                    param="messages",
                )
            open_call_ids.discard(message.tool_call_id)
            rendered.append(
                {"role": "tool", "content": message.text, "tool_call_id": message.tool_call_id}
            )
            continue
        entry: dict[str, Any] = {"role": message.role, "content": message.text}
        if message.role == "assistant" and message.tool_calls:
            entry["tool_calls"] = [_template_call(call, where) for call in message.tool_calls]
            open_call_ids = {call.id for call in message.tool_calls}
        rendered.append(entry)
    if rendered[-1]["role"] not in ("user", "tool"):
        raise ApiError(
            400, "The last message must be a user message or a tool result.", param="messages"
        )
    return rendered


def _template_call(call, where: str) -> dict:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise ApiError(
            400,
            f"{where}: the arguments of tool call {call.id!r} must be a JSON object as text.",
            param="messages",
        )
    return {
        "type": "function",
        "id": call.id,
        "function": {"name": call.function.name, "arguments": arguments},
    }


def render_prompt(
    engine: Engine, model_name: str, messages: list[dict], tools: list[dict]
) -> list[int]:
    """The prompt's token ids, rendered by the model's chat template."""
    tokenizer = engine.tokenizer
    if not supports_tool_calls(getattr(tokenizer, "chat_template", None)):
        raise ApiError(
            400,
            f"This server does not serve tool calls with `{model_name}`: its chat template does "
            "not define them; serve a model whose template does (Qwen2.5 and later).",
            param="tools",
            code="unsupported_parameter",
        )
    with engine.tokenizer_lock:
        text = tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        # NOTE: the API client wrote every message, so control tokens are read as such.
        return list(tokenizer.encode(text, add_special_tokens=False))


async def tool_chat_completion(
    body: ChatCompletionRequest,
    params: SamplingParams,
    api_key,
    engine: Engine,
    model_name: str,
    default_system_prompt: str,
):
    if body.rag is not None:
        raise ApiError(400, "rag cannot be combined with tools yet.", param="rag")
    if params.logprobs is not None:
        raise ApiError(400, "logprobs cannot be combined with tools yet.", param="logprobs")
    tools, params = tool_params(body, params)
    messages = template_messages(body.messages, default_system_prompt)
    prompt = await sync_to_async(render_prompt, thread_sensitive=False)(
        engine, model_name, messages, tools
    )
    if params.structured_output is not None:
        await compile_grammar(engine, params.structured_output, param="tools")
    try:
        request_id = f"api-{uuid.uuid4().hex[:16]}"
        stream = engine.stream(prompt, params, request_id, cache_salt_for(api_key.user))
    except PromptTooLongError as error:
        raise ApiError(400, str(error), code="context_length_exceeded", param="messages") from None
    parse = bool(tools) and body.tool_choice != "none"
    header = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": model_name,
    }
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return event_stream(
            _stream(stream, header, api_key, parse=parse, include_usage=include_usage)
        )
    return await _whole(stream, header, api_key, parse=parse)


def _call_json(call: ToolCall, index: int | None = None) -> dict:
    """A parsed call as OpenAI writes it (with its index in a streamed delta)."""
    entry = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    return entry if index is None else {"index": index, **entry}


def _split(
    parser: ToolCallParser | None, text: str, *, final: bool = False
) -> list[str | ToolCall]:
    if parser is None:
        return [text] if text else []
    events = parser.feed(text)
    return events + parser.finish() if final else events


@dataclasses.dataclass(slots=True)
class _Outcome:
    reason: str | None = None
    usage: Usage | None = None


async def _events(
    stream: AsyncIterator[Delta | Usage], parse: bool, outcome: _Outcome
) -> AsyncIterator[str | ToolCall]:
    """The answer's content and calls in order; its finish reason and usage go to `outcome`."""
    parser = ToolCallParser() if parse else None
    async for item in stream:
        if isinstance(item, Usage):
            outcome.usage = item
            continue
        outcome.reason = item.finish_reason or outcome.reason
        for event in _split(parser, item.text, final=item.finish_reason is not None):
            yield event


async def _whole(stream: AsyncIterator[Delta | Usage], header: dict, api_key, *, parse: bool):
    content: list[str] = []
    calls: list[dict] = []
    outcome = _Outcome()
    try:
        async for event in _events(stream, parse, outcome):
            if isinstance(event, ToolCall):
                calls.append(_call_json(event))
            else:
                content.append(event)
    except RequestFailedError:
        outcome.reason = "error"
    except EngineClosedError:
        outcome.reason = "abort"
    finally:
        await settle(api_key, outcome.usage)
    reason, usage = outcome.reason, outcome.usage
    if reason == "error":
        raise ApiError(500, "The engine failed while answering; retry.", code="engine_error")
    if reason == "abort":
        raise engine_aborted()
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = calls
    return JsonResponse(
        {
            **header,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": _reason(reason, calls)}],
            "usage": usage_of(usage),
        }
    )


async def _stream(
    stream: AsyncIterator[Delta | Usage], header: dict, api_key, *, parse: bool, include_usage: bool
) -> AsyncIterator[str]:
    def chunk(delta: dict, finish_reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return sse({**header, "object": "chat.completion.chunk", "choices": [choice]})

    num_calls, outcome = 0, _Outcome()
    try:
        async with contextlib.aclosing(stream):
            yield chunk({"role": "assistant", "content": ""})
            try:
                async for event in _events(stream, parse, outcome):
                    if isinstance(event, ToolCall):
                        yield chunk({"tool_calls": [_call_json(event, num_calls)]})
                        num_calls += 1
                    else:
                        yield chunk({"content": event})
            except RequestFailedError:
                yield sse(ENGINE_FAILED)
                return
            except EngineClosedError:
                yield sse(ENGINE_ABORTED)
                return
        if outcome.reason == "abort":
            yield sse(ENGINE_ABORTED)
            return
        yield chunk({}, _reason(outcome.reason, num_calls))
        if include_usage:
            usage_chunk = {**header, "object": "chat.completion.chunk", "choices": []}
            yield sse(usage_chunk | {"usage": usage_of(outcome.usage)})
        yield sse("[DONE]")
    finally:
        await asyncio.shield(settle(api_key, outcome.usage))


def _reason(engine_reason: str | None, calls: object) -> str:
    if calls and engine_reason == "stop":
        return "tool_calls"
    return openai_finish_reason(engine_reason)
