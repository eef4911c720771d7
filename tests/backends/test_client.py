"""backends.client: a streamed chat completion on a real remote Cachet server.

Streaming yields the remote's text and its usage (cached tokens included), identical to the
remote's own non-streamed answer under greedy decoding; closing the stream aborts the request on
the remote (its /metrics counts the abort); an unreachable replica or a refused key is
"unavailable" (fail over), a request the remote refuses is a `RemoteRequestError`.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backends.client import (
    BackendUnavailable,
    RemoteRequestError,
    RemoteStream,
    chat_payload,
    usage_from_json,
)
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.outputs import Delta, Usage
from tests.polling import wait_until
from tests.remote_cachet import backend_for, remote_metric, unreachable_url

SYSTEM = "You are a terse assistant. " * 40  # long enough to fill several KV blocks
GREEDY = SamplingParams(temperature=0, max_tokens=16, seed=0)
ABORTED = 'cachet_engine_requests_total{finish_reason="abort"}'


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


async def opened(backend, payload: dict) -> RemoteStream:
    stream = RemoteStream(backend, payload, "test-request", timeout_s=60)
    await stream.open()
    return stream


async def streamed(backend, payload: dict) -> tuple[str, list[Delta], Usage | None]:
    stream = await opened(backend, payload)
    deltas, usage = [], None
    async for item in stream:
        if isinstance(item, Usage):
            usage = item
        else:
            deltas.append(item)
    return "".join(d.text for d in deltas), deltas, usage


def test_the_payload_carries_the_sampling_settings_and_extensions_only_when_set() -> None:
    payload = chat_payload("m", [], SamplingParams(temperature=0, max_tokens=5, seed=3))
    assert payload["stream"] is True and payload["stream_options"] == {"include_usage": True}
    assert (payload["temperature"], payload["max_tokens"], payload["seed"]) == (0, 5, 3)
    assert "top_k" not in payload and "ignore_eos" not in payload and "stop" not in payload
    extended = chat_payload("m", [], SamplingParams(top_k=4, ignore_eos=True, stop=["x"]))
    assert (extended["top_k"], extended["ignore_eos"], extended["stop"]) == (4, True, ["x"])


def test_usage_maps_cached_tokens_and_measures_decode_speed_here() -> None:
    usage = usage_from_json(
        "r",
        {
            "prompt_tokens": 90,
            "completion_tokens": 11,
            "prompt_tokens_details": {"cached_tokens": 64},
        },
        ttft_s=0.2,
        decode_s=2.0,
        total_s=2.2,
    )
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (90, 64, 11)
    assert usage.tokens_per_s == pytest.approx(5.0) and usage.ttft_s == 0.2
    bare = usage_from_json(
        "r", {"prompt_tokens": 3, "completion_tokens": 1}, ttft_s=None, decode_s=0, total_s=1
    )
    assert bare.cached_tokens == 0 and bare.tokens_per_s == 0.0
    deepseek = {"prompt_tokens": 90, "prompt_cache_hit_tokens": 80, "prompt_cache_miss_tokens": 10}
    assert usage_from_json("r", deepseek, ttft_s=None, decode_s=0, total_s=1).cached_tokens == 80


async def test_a_stream_gives_the_remote_answer_and_its_usage_with_cached_tokens(
    remote_cachet,
) -> None:
    backend = backend_for(remote_cachet)
    payload = chat_payload(remote_cachet.model, messages("Name a colour."), GREEDY)
    text, deltas, usage = await streamed(backend, payload)

    assert text and deltas[-1].finish_reason in {"stop", "length"}
    assert all(d.token_ids == () for d in deltas)  # another model's ids are never invented
    assert usage.prompt_tokens > 200 and 0 < usage.completion_tokens <= 16
    assert usage.ttft_s > 0 and usage.total_s >= usage.ttft_s

    again = chat_payload(remote_cachet.model, messages("Name a fruit."), GREEDY)
    second_text, _, second = await streamed(backend, again)
    assert second.cached_tokens >= 200  # the system prompt came from the remote's prefix cache

    # NOTE: the same request without streaming gives the same text. Compared on the warm one:
    # a cold prompt's prefill may run on int8 codes (prefill_weights), a warm one's few new
    # tokens on the quantized kernels, and a greedy pick can differ between those two roundings.
    reference = httpx.post(
        backend.chat_completions_url,
        json=again | {"stream": False, "stream_options": None},
        headers={"Authorization": f"Bearer {remote_cachet.key}"},
        timeout=60,
    ).json()
    assert reference["choices"][0]["message"]["content"] == second_text


async def test_closing_the_stream_mid_answer_aborts_the_request_on_the_remote(
    remote_cachet,
) -> None:
    before = remote_metric(remote_cachet, ABORTED)
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    payload = chat_payload(remote_cachet.model, messages("Count to five hundred."), params)
    stream = await opened(backend_for(remote_cachet), payload)
    texts = []
    async for item in stream:
        texts.append(item.text)
        if len(texts) == 3:
            stream.abort()
    assert 3 <= len(texts) < 20  # it stopped at once, not after 400 tokens

    await asyncio.to_thread(
        wait_until, lambda: remote_metric(remote_cachet, ABORTED) > before, 30, "the abort"
    )
    running = remote_metric(remote_cachet, "cachet_engine_requests_running")
    assert running == 0


async def test_abort_while_waiting_for_the_first_token_ends_the_stream_without_one(
    remote_cachet,
) -> None:
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    payload = chat_payload(remote_cachet.model, messages("Count to five hundred."), params)
    stream = await opened(backend_for(remote_cachet), payload)
    stream.abort()
    assert [item async for item in stream] == []


async def test_an_unreachable_replica_and_a_refused_key_are_unavailable(remote_cachet) -> None:
    payload = chat_payload(remote_cachet.model, messages("Hi"), GREEDY)
    with pytest.raises(BackendUnavailable, match="ConnectError"):
        await opened(backend_for(remote_cachet, base_url=unreachable_url()), payload)
    with pytest.raises(BackendUnavailable, match="HTTP 401"):
        await opened(backend_for(remote_cachet, api_key="ck-not-a-key"), payload)
    with pytest.raises(BackendUnavailable, match="HTTP 404"):
        await opened(backend_for(remote_cachet), payload | {"model": "no-such-model"})


async def test_a_request_the_remote_refuses_is_a_request_error_with_its_code(
    remote_cachet,
) -> None:
    payload = chat_payload(remote_cachet.model, messages("word " * 20_000), GREEDY)
    with pytest.raises(RemoteRequestError) as refused:
        await opened(backend_for(remote_cachet), payload)
    assert refused.value.status == 400 and refused.value.code == "context_length_exceeded"
