"""/v1 against the load testers people benchmark with: guidellm 0.8.1 and `vllm bench serve`
(vLLM 0.34.0), replayed in-process on the served engine.

The request bodies and headers are the ones those clients sent to a live Cachet in the runs of
docs/benchmark-clients.md (captured at the server); only the model, the prompts' length and
`max_tokens` are made small. Each response is read the way the client reads it (the parsers below
follow guidellm's `backends/openai/request_handlers.py` and vLLM's
`benchmarks/lib/endpoint_request_func.py`), so a change that would make a client fail a request,
time the wrong chunk as the first token, or miscount the tokens fails here.
"""

from __future__ import annotations

import codecs
import json

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import AsyncClient

from api import rate_limits
from api.models import ApiKey

pytestmark = [pytest.mark.real_weights, pytest.mark.django_db(transaction=True)]

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 8

# guidellm's synthetic_text data (a per-request "<run> <index> m0" prefix, then words).
GUIDELLM_PROMPT = (
    "1 0 m0 Best event production north nearly we produce today. Everything his she indeed "
    "law difficult physical.\nContain official page hand behavior.\nNote south specific share."
)
# vLLM's random dataset: token ids drawn from the vocabulary, decoded (any script, any order).
VLLM_PROMPT = (
    " m\u1ee9c\u0445\u0430 \uc7ac\u0e09\u0e31\u0e19\u0440\u0443\u0436 a\u00e7\u0131k"
    "\u0648\u0627\u0644 \u05d6\u05de\u05df\u4eba\u306f\u0639\u064a\u0646\u044f\u0445 "
    "\u05d2\u05d3\u05d5\u05dc\u05e8\u05d5\u05d1g\u00f3\ub77c\uace0 arkada\u015f"
)

# httpx's headers (guidellm), aiohttp's (vLLM); Authorization is added per request.
GUIDELLM_HEADERS = {
    "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate",
    "Connection": "keep-alive",
    "User-Agent": "python-httpx/0.29.0",
}
VLLM_HEADERS = {
    "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate",
    "User-Agent": "Python/3.11 aiohttp/3.14.5",
    "X-Request-Id": "bench-97d5266c-0",
}

GUIDELLM_CHAT = {
    "model": MODEL,
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "max_completion_tokens": MAX_TOKENS,
    "ignore_eos": True,
    "messages": [{"role": "user", "content": [{"type": "text", "text": GUIDELLM_PROMPT}]}],
}
GUIDELLM_COMPLETIONS = {
    "model": MODEL,
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "max_tokens": MAX_TOKENS,
    "ignore_eos": True,
    "prompt": GUIDELLM_PROMPT,
}
VLLM_COMPLETIONS = {  # --backend openai
    "model": MODEL,
    "prompt": VLLM_PROMPT,
    "repetition_penalty": 1.0,
    "max_tokens": MAX_TOKENS,
    "logprobs": None,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": True,
}
VLLM_CHAT = {  # --backend openai-chat
    "model": MODEL,
    "messages": [{"role": "user", "content": [{"type": "text", "text": VLLM_PROMPT}]}],
    "max_completion_tokens": MAX_TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": True,
}


async def key_headers(username: str, headers: dict) -> dict:
    def create() -> str:
        rate_limits.reset()
        return ApiKey.create_for(User.objects.create_user(username), "bench")[1]

    return {**headers, "Authorization": f"Bearer {await sync_to_async(create)()}"}


async def post_stream(path: str, body: dict, headers: dict) -> list[bytes]:
    """The response body as the pieces the server sent, as a streaming client receives it."""
    response = await AsyncClient().post(
        path, json.dumps(body), content_type="application/json", headers=headers
    )
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/event-stream")
    return [piece async for piece in response.streaming_content]


# ---- guidellm: lines of `data: {...}`, `data: [DONE]` ends ----


def guidellm_read(pieces: list[bytes], chat: bool) -> dict:
    """What guidellm keeps of a stream: the text of the token-bearing lines, how many there were
    (the first one stamps the time to first token) and the last usage seen."""
    texts, usage, done = [], None, False
    for line in b"".join(pieces).decode().splitlines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        line = line[len("data:") :].strip()
        if line == "[DONE]":
            done = True
            break
        data = json.loads(line)
        assert not data.get("error"), data  # guidellm fails the request on a streamed error
        choices = data.get("choices", [])
        choice = choices[0] if choices else {}
        text = choice.get("delta", {}).get("content") if chat else choice.get("text")
        if text:
            texts.append(text)
        if data.get("usage"):
            usage = data["usage"]
    return {"texts": texts, "usage": usage, "done": done}


# ---- vLLM: messages split on blank lines, each `data: ...` ----


def vllm_messages(pieces: list[bytes]) -> list[str]:
    decoder, buffer, messages = codecs.getincrementaldecoder("utf-8")(), "", []
    for piece in pieces:
        buffer += decoder.decode(piece)
        while "\n\n" in buffer:
            message, buffer = buffer.split("\n\n", 1)
            if message.strip():
                messages.append(message.strip())
    assert not buffer.strip(), f"a message without its closing blank line: {buffer!r}"
    return messages


def vllm_has_streamed_output(choice: dict) -> bool:
    """vLLM's test for a chunk that carries a token (the opening `role` chunk does not)."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
        return True
    return delta.get("content") == "" and "role" not in delta


def vllm_read(pieces: list[bytes], chat: bool) -> dict:
    """What `vllm bench serve` keeps of a stream: the token chunks (the first one is its TTFT,
    the gaps between the next ones its ITL) and the usage's token counts."""
    token_chunks, generated, output_tokens, prompt_len = 0, "", None, None
    for message in vllm_messages(pieces):
        if message.startswith(":"):
            continue
        chunk = message.removeprefix("data: ")
        if chunk == "[DONE]":
            continue
        data = json.loads(chunk)
        assert not data.get("error"), data  # vLLM fails the request on a streamed error
        choices = data.get("choices")
        if choices and (not chat or vllm_has_streamed_output(choices[0])):
            token_chunks += 1
            generated += (choices[0]["delta"].get("content") if chat else choices[0]["text"]) or ""
        elif usage := data.get("usage"):
            output_tokens, prompt_len = usage.get("completion_tokens"), usage.get("prompt_tokens")
    return {
        "token_chunks": token_chunks,
        "text": generated,
        "output_tokens": output_tokens,
        "prompt_len": prompt_len,
        "done": chunk == "[DONE]",
    }


async def test_guidellm_finds_the_server_healthy_and_takes_the_first_listed_model(
    served_engine,
) -> None:
    headers = await key_headers("guidellm", GUIDELLM_HEADERS)
    client = AsyncClient()
    health = await client.get("/health", headers=headers)  # validate_backend, before a run
    assert health.status_code == 200, health.content
    models = await client.get("/v1/models", headers=headers)  # its model when none is given
    assert models.status_code == 200
    assert models.json()["data"][0]["id"] == MODEL


async def test_guidellm_chat_requests_stream_deltas_and_end_with_usage_and_done(
    served_engine,
) -> None:
    headers = await key_headers("guidellm", GUIDELLM_HEADERS)
    read = guidellm_read(await post_stream("/v1/chat/completions", GUIDELLM_CHAT, headers), True)
    assert read["done"] and read["texts"]
    # ignore_eos: exactly the tokens asked for, which guidellm takes from the usage.
    assert read["usage"]["completion_tokens"] == MAX_TOKENS
    assert read["usage"]["prompt_tokens"] > 0
    assert 1 <= len(read["texts"]) <= MAX_TOKENS


async def test_guidellm_completion_requests_stream_text_and_end_with_usage_and_done(
    served_engine,
) -> None:
    headers = await key_headers("guidellm", GUIDELLM_HEADERS)
    read = guidellm_read(await post_stream("/v1/completions", GUIDELLM_COMPLETIONS, headers), False)
    assert read["done"] and read["texts"]
    assert read["usage"]["completion_tokens"] == MAX_TOKENS
    assert read["usage"]["prompt_tokens"] > 0
    assert 1 <= len(read["texts"]) <= MAX_TOKENS


async def test_vllm_bench_completion_requests_count_one_chunk_per_text_piece_and_the_usage(
    served_engine,
) -> None:
    headers = await key_headers("vllm-bench", VLLM_HEADERS)
    pieces = await post_stream("/v1/completions", VLLM_COMPLETIONS, headers)
    read = vllm_read(pieces, chat=False)
    assert read["done"] and read["text"]
    assert read["output_tokens"] == MAX_TOKENS and read["prompt_len"] > 0
    # Every chunk with choices is timed as a token: none may be empty.
    assert 1 <= read["token_chunks"] <= MAX_TOKENS


async def test_vllm_bench_chat_requests_do_not_time_the_opening_role_chunk_as_a_token(
    served_engine,
) -> None:
    headers = await key_headers("vllm-bench", VLLM_HEADERS)
    pieces = await post_stream("/v1/chat/completions", VLLM_CHAT, headers)
    first = json.loads(vllm_messages(pieces)[0].removeprefix("data: "))
    # Sent before the prefill: were it taken for a token, TTFT would read as ~0.
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert not vllm_has_streamed_output(first["choices"][0])
    read = vllm_read(pieces, chat=True)
    assert read["done"] and read["text"]
    assert read["output_tokens"] == MAX_TOKENS and read["prompt_len"] > 0
    assert 1 <= read["token_chunks"] <= MAX_TOKENS


async def test_a_stream_ends_with_one_usage_chunk_without_choices_then_done(
    served_engine,
) -> None:
    headers = await key_headers("vllm-bench", VLLM_HEADERS)
    for path, body in [("/v1/chat/completions", VLLM_CHAT), ("/v1/completions", VLLM_COMPLETIONS)]:
        messages = vllm_messages(await post_stream(path, body, headers))
        assert messages[-1] == "data: [DONE]"
        usage_chunk = json.loads(messages[-2].removeprefix("data: "))
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
        earlier = [json.loads(m.removeprefix("data: ")) for m in messages[:-2]]
        assert all(chunk["choices"] and "usage" not in chunk for chunk in earlier), path
