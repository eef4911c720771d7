"""chat.turn with a remote backend, end to end: this process's engine is the local model, a second
Cachet server process (tests/remote_cachet.py) the remote one.

The router sends a long turn to the remote model and a short one to the local engine, and the
answer records who answered (message stats, /metrics); an explicit model choice wins; stopping a
remote answer closes its stream and the remote aborts the request; the REST API lists and serves
the remote model; when the remote server is killed, automatic turns fall back to the local
engine while explicit ones get `backend_unavailable`, and it is used again once it is back.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import AsyncClient, Client

from chat.answer import TurnControl
from chat.errors import ChatError
from chat.events import TokenDelta, TurnDone, TurnStarted
from chat.models import Message
from chat.turn import TurnRequest, run_turn
from inference.model_files import DEFAULT_EMBEDDING_MODEL
from tests.polling import wait_until
from tests.remote_cachet import backend_for, remote_metric

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.real_weights]

LONG_QUESTION = "Summarise this in one line: " + "The quick brown fox jumps over the dog. " * 12
ABORTED = 'cachet_engine_requests_total{finish_reason="abort"}'


@pytest.fixture
def upstream(remote_cachet, settings):
    """The remote server as the backend for complex turns; turns of 300+ characters are complex."""
    settings.CACHET_ROUTE_PROMPT_CHARS = 300
    backend = backend_for(remote_cachet)
    backend.save()
    return backend


async def answer_to(request: TurnRequest, control: TurnControl | None = None) -> Message:
    events = [event async for event in run_turn(request, control)]
    done = events[-1]
    assert isinstance(done, TurnDone), events
    return await Message.objects.aget(pk=done.message.pk)


def local_metrics() -> str:
    staff = User.objects.create_user(f"ops-{time.monotonic_ns()}", is_staff=True)
    client = Client()
    client.force_login(staff)
    response = client.get("/metrics")
    assert response.status_code == 200
    return response.content.decode()


async def test_a_long_turn_goes_to_the_remote_model_and_a_short_one_stays_local(
    served_engine, quick_profile, alice, upstream, remote_cachet
) -> None:
    short = await answer_to(TurnRequest(user=alice, content="Say hello.", seed=1))
    assert (short.backend, short.route, short.model) == ("local", "short", "smollm2-135m-instruct")
    assert short.token_ids

    long = await answer_to(TurnRequest(user=alice, content=LONG_QUESTION, seed=1))
    assert (long.backend, long.route, long.model) == (
        "upstream",
        "long_prompt",
        remote_cachet.model,
    )
    assert long.content and long.finish_reason in {"stop", "length"}
    assert long.token_ids is None  # another model's ids: never replayed into our prompts
    assert long.prompt_tokens > 100 and 0 < long.completion_tokens <= 24
    assert long.cached_tokens is not None and long.ttft_s > 0
    assert (
        long.as_json()["stats"] | {"backend": "upstream", "route": "long_prompt"}
        == (long.as_json()["stats"])
    )

    # The next turn of that chat is long too (its history): the remote answers again, and its
    # prefix cache serves the turn it saw before.
    follow_up = await answer_to(
        TurnRequest(user=alice, content="And in French?", conversation_id=long.conversation_id)
    )
    assert follow_up.backend == "upstream" and follow_up.cached_tokens > 50

    metrics = await sync_to_async(local_metrics)()
    assert 'cachet_backend_requests_total{backend="upstream",outcome="ok"}' in metrics
    assert 'cachet_route_decisions_total{backend="upstream",reason="long_prompt"}' in metrics
    assert 'cachet_route_decisions_total{backend="local",reason="short"}' in metrics


async def test_an_explicit_model_choice_wins_and_an_unknown_model_is_refused(
    served_engine, quick_profile, alice, upstream, remote_cachet
) -> None:
    chosen = await answer_to(TurnRequest(user=alice, content="Hi", model=remote_cachet.model))
    assert (chosen.backend, chosen.route) == ("upstream", "explicit")
    local = await answer_to(
        TurnRequest(user=alice, content=LONG_QUESTION, model="smollm2-135m-instruct")
    )
    assert (local.backend, local.route) == ("local", "explicit")
    with pytest.raises(ChatError) as refused:
        await answer_to(TurnRequest(user=alice, content="Hi", model="gpt-5"))
    assert refused.value.code == "unknown_model" and remote_cachet.model in refused.value.message


async def test_stopping_a_remote_answer_closes_its_stream_and_the_remote_aborts_it(
    served_engine, quick_profile, alice, upstream, remote_cachet
) -> None:
    await type(quick_profile).objects.filter(pk=quick_profile.pk).aupdate(max_tokens=400)
    before = await asyncio.to_thread(remote_metric, remote_cachet, ABORTED)
    control, texts = TurnControl(), []
    request = TurnRequest(user=alice, content=LONG_QUESTION + " Then count to 500.")
    async for event in run_turn(request, control):
        if isinstance(event, TokenDelta):
            texts.append(event.text)
            if len(texts) == 3:
                control.stop()
        if isinstance(event, TurnDone):
            message = event.message
    assert message.backend == "upstream" and message.finish_reason == "stopped"
    assert message.content == "".join(texts)
    await asyncio.to_thread(
        wait_until,
        lambda: remote_metric(remote_cachet, ABORTED) > before,
        30,
        "the remote to abort the request",
    )


async def test_a_client_gone_mid_remote_answer_aborts_it_and_keeps_the_partial_answer(
    served_engine, quick_profile, alice, upstream, remote_cachet
) -> None:
    await type(quick_profile).objects.filter(pk=quick_profile.pk).aupdate(max_tokens=400)
    before = await asyncio.to_thread(remote_metric, remote_cachet, ABORTED)
    events = run_turn(TurnRequest(user=alice, content=LONG_QUESTION + " Then count to 500."))
    async for event in events:
        if isinstance(event, TurnStarted):
            conversation_id = event.conversation.pk
        if isinstance(event, TokenDelta):
            break
    await events.aclose()  # what a vanished client's task does
    answer = await Message.objects.filter(conversation_id=conversation_id, role="assistant").aget()
    assert (answer.backend, answer.finish_reason) == ("upstream", "stopped") and answer.content
    await asyncio.to_thread(
        wait_until,
        lambda: remote_metric(remote_cachet, ABORTED) > before,
        30,
        "the remote to abort the request",
    )


def api_key_for(username: str) -> str:
    from api import rate_limits
    from api.models import ApiKey

    rate_limits.reset()
    return ApiKey.create_for(User.objects.create_user(username), "ci")[1]


async def test_the_api_lists_and_serves_the_remote_model_with_its_usage(
    served_engine, upstream, remote_cachet
) -> None:
    key = await sync_to_async(api_key_for)("integrator")
    # NOTE: headers per request: AsyncClient(headers=...) did not reach the API's auth.
    client, auth = AsyncClient(), {"Authorization": f"Bearer {key}"}
    models = (await client.get("/v1/models", headers=auth)).json()
    assert "data" in models, models
    listed = [model["id"] for model in models["data"]]
    assert listed == ["smollm2-135m-instruct", remote_cachet.model, "auto", DEFAULT_EMBEDDING_MODEL]

    system = {"role": "system", "content": "Be terse. " * 30}
    body = {
        "model": remote_cachet.model,
        "messages": [system, {"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    for _ in range(2):
        response = await client.post(
            "/v1/chat/completions", body, content_type="application/json", headers=auth
        )
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["model"] == remote_cachet.model and answer["choices"][0]["message"]["content"]
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64  # the remote's cache

    streamed = await client.post(
        "/v1/chat/completions",
        body | {"stream": True},
        content_type="application/json",
        headers=auth,
    )
    raw = b"".join([part async for part in streamed.streaming_content]).decode()
    events = raw.split("\n\n")
    chunks = [json.loads(e.removeprefix("data: ")) for e in events if e and e != "data: [DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == answer["choices"][0]["message"]["content"] and events[-2] == "data: [DONE]"

    refused = await client.post(
        "/v1/chat/completions",
        body | {"model": "gpt-5"},
        content_type="application/json",
        headers=auth,
    )
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"


async def test_a_killed_remote_makes_auto_turns_fall_back_and_explicit_ones_fail_until_it_is_back(
    served_engine, quick_profile, alice, upstream, remote_cachet, settings
) -> None:
    settings.CACHET_BACKEND_RETRY_S = 1
    await asyncio.to_thread(remote_cachet.kill)
    try:
        fallback = await answer_to(TurnRequest(user=alice, content=LONG_QUESTION, seed=1))
        assert (fallback.backend, fallback.route) == ("local", "fallback")
        assert fallback.model == "smollm2-135m-instruct" and fallback.content
        row = await type(upstream).objects.aget(pk=upstream.pk)
        assert row.health == "down" and "ConnectError" in row.health_detail

        with pytest.raises(ChatError) as unavailable:
            await answer_to(TurnRequest(user=alice, content="Hi", model=remote_cachet.model))
        assert unavailable.value.code == "backend_unavailable"
    finally:
        await asyncio.to_thread(remote_cachet.start)
    await asyncio.sleep(1.1)  # past the retry interval: the next turn tries it again
    again = await answer_to(TurnRequest(user=alice, content=LONG_QUESTION, seed=1))
    assert (again.backend, again.route) == ("upstream", "long_prompt")
    row = await type(upstream).objects.aget(pk=upstream.pk)
    assert row.health == "up"
