"""Faults: the engine reloaded (another model configuration activated) while requests stream.

A real server (LiveServer) streams chat completions to several API clients and a chat socket
when a staff user activates another ModelConfig through the admin — the real path: log in, then
the changelist's "activate" action with the CSRF token. The new engine loads in the background
and is swapped in; the requests in flight finish on the old engine (all their tokens, no abort),
requests keep being answered throughout (no 5xx, no error), and requests after the swap run on
the new engine (its counters start from zero and count exactly them).

In-process: a request that took the old engine just before the swap still runs on it (the old
engine is not shut down as idle at once), and a request that the engine does abort (it outlived
the old engine's drain period) ends with a clear `engine_restarted` error, not a truncated answer
that looks whole.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import re
import threading
import time
import urllib.parse
import urllib.request

import openai
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import AsyncClient

from api.models import ApiKey
from harness import ChatClient, LiveServer, TurnResult
from inference import runtime
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.outputs import EngineClosedError
from inference.models import ModelConfig
from tests.reliability.helpers import wait_for

pytestmark = pytest.mark.real_weights

MODEL = "smollm2-135m-instruct"
PASSWORD = "reload-admin-password-1"
SETUP = f"""
from django.contrib.auth.models import User
from api.models import ApiKey
from inference.models import ModelConfig

admin = User.objects.create_superuser("reloader", password={PASSWORD!r})
config = ModelConfig.objects.create(name="small-batch", max_num_seqs=4, kv_cache_mb=256)
_, key = ApiKey.create_for(admin, "load", requests_per_minute=100000, tokens_per_minute=10**9)
print(config.pk, key)
"""
# A chat user and a greedy profile (harness.site), for the socket turn across the swap.
SITE = {"label": "reload", "profile": {"temperature": 0.0, "max_tokens": 48, "search_top_k": 3}}
LONG_TOKENS = 192  # the streams in flight across the swap
SHORT_TOKENS = 8  # the steady stream of requests around it
IN_FLIGHT = 3
STEADY_CLIENTS = 2


class Outcome:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.started = time.monotonic()
        self.ended: float | None = None
        self.finish_reason: str | None = None
        self.completion_tokens: int | None = None
        self.error: str | None = None


def stream_chat(client: openai.OpenAI, max_tokens: int, kind: str) -> Outcome:
    outcome = Outcome(kind)
    try:
        chunks = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a long story about a lighthouse."}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].finish_reason:
                outcome.finish_reason = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                outcome.completion_tokens = chunk.usage.completion_tokens
    except Exception as error:  # recorded; the test asserts there is none
        outcome.error = f"{type(error).__name__}: {error}"
    outcome.ended = time.monotonic()
    return outcome


def admin_activate(live: LiveServer, config_id: str) -> int:
    """Log in to the admin and run the "activate" action on `config_id`; the final status."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    def csrf_token(path: str) -> str:
        with opener.open(f"{live.url}{path}", timeout=30) as response:
            page = response.read().decode()
        return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)

    def post(path: str, fields: dict) -> int:
        request = urllib.request.Request(
            f"{live.url}{path}",
            data=urllib.parse.urlencode(fields).encode(),
            headers={"Referer": f"{live.url}{path}"},
        )
        with opener.open(request, timeout=30) as response:  # follows the redirect
            return response.status

    login = "/admin/login/?next=/admin/"
    post(login, {"csrfmiddlewaretoken": csrf_token(login), "username": "reloader",
                 "password": PASSWORD, "next": "/admin/"})  # fmt: skip
    changelist = "/admin/inference/modelconfig/"
    return post(changelist, {"csrfmiddlewaretoken": csrf_token(changelist),
                             "action": "activate_selected", "_selected_action": config_id,
                             "index": "0"})  # fmt: skip


def engine_detail(live: LiveServer) -> str:
    with urllib.request.urlopen(f"{live.url}/healthz", timeout=30) as response:
        return json.load(response)["components"]["engine"]["detail"]


@pytest.fixture
def live(chat_model_dir):
    # NOTE: one torch thread: on two shared cores, two threads per engine slow a busy machine
    # down many times over, and what runs must finish within the old engine's drain period.
    with LiveServer(models_dir=chat_model_dir.parent, torch_threads=1) as server:
        server.config_id, server.key = server.shell(SETUP).split()
        server.site = server.call("harness.site:prepare_site", SITE)
        server.start()
        yield server


def test_an_engine_reload_under_load_finishes_what_runs_and_serves_the_rest(live) -> None:
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=live.key, max_retries=0)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    stop = threading.Event()

    def run(max_tokens: int, kind: str) -> None:
        outcome = stream_chat(client, max_tokens, kind)
        with lock:
            outcomes.append(outcome)

    def steady() -> None:
        while not stop.is_set():
            run(SHORT_TOKENS, "steady")

    site = live.site
    chat = ChatClient(
        live.port, f"{site['cookie_name']}={site['sessions'][0]}", site["profile_id"], [], 300
    )
    socket_result = TurnResult(0, 1)

    async def socket_turn() -> None:
        sock = await chat.connect()
        await chat.turn(sock, socket_result, "Tell me a long story about a lighthouse.", seed=3)
        await sock.close()

    threads = [threading.Thread(target=steady) for _ in range(STEADY_CLIENTS)]
    threads += [
        threading.Thread(target=run, args=(LONG_TOKENS, "in flight")) for _ in range(IN_FLIGHT)
    ]
    threads.append(threading.Thread(target=asyncio.run, args=(socket_turn(),)))
    for thread in threads:
        thread.start()
    wait_for(lambda: live.engine_metrics().get("generation_tokens", 0) > 0, 60, "streaming")

    assert admin_activate(live, live.config_id) == 200
    reload_started = time.monotonic()
    wait_for(
        lambda: engine_detail(live).startswith("'small-batch' ready"), 300, "the new engine",
        interval_s=0.5,
    )  # fmt: skip
    swapped = time.monotonic()
    time.sleep(2)  # the steady clients go on on the new engine for a while
    stop.set()
    for thread in threads:
        thread.join(300)
    assert not any(thread.is_alive() for thread in threads)

    report = [
        (o.kind, round(o.started - reload_started, 1), round(o.ended - reload_started, 1),
         o.finish_reason, o.completion_tokens, o.error)
        for o in outcomes
    ]  # fmt: skip
    report.append(("swapped", round(swapped - reload_started, 1)))
    errors = [o.error for o in outcomes if o.error]
    assert not errors, report
    assert all(o.finish_reason == "length" for o in outcomes), report
    in_flight = [o for o in outcomes if o.kind == "in flight"]
    assert len(in_flight) == IN_FLIGHT
    # Started before the reload, finished after it began, every token delivered.
    assert all(o.started < reload_started < o.ended for o in in_flight)
    assert all(o.completion_tokens == LONG_TOKENS for o in in_flight)
    assert socket_result.error is None, socket_result.error
    assert socket_result.finish_reason in {"length", "stop"}
    assert any(o.started > swapped for o in outcomes if o.kind == "steady")

    # ...and they were still running when the new engine took over (drained, not aborted).
    assert any(o.ended > swapped for o in in_flight)

    # New requests run on the new engine: its counters started at zero and count exactly them.
    counted = live.engine_metrics()["requests"]
    started_after_swap = sum(o.started > swapped for o in outcomes)
    started_after_reload = sum(o.started > reload_started for o in outcomes)
    assert started_after_swap <= counted <= started_after_reload
    for _ in range(3):
        run(SHORT_TOKENS, "after")
    assert live.engine_metrics()["requests"] == counted + 3
    assert engine_detail(live).startswith("'small-batch' ready")

    log = live.log_tail(10**7)
    assert "engine 'small-batch' ready" in log
    assert "Internal Server Error" not in log
    assert "Exception inside application" not in log
    assert not re.search(r'" 5\d\d ', log.replace('"GET /healthz" 503', "")), log[-3000:]


# ---- in-process: the runtime's swap and the API's answer to an aborted request ----


@pytest.fixture
def fresh_runtime(chat_model_dir):
    runtime.stop_engine()
    runtime.start_engine(wait=True)
    yield
    runtime.stop_engine()


@pytest.mark.django_db(transaction=True)
def test_a_request_that_took_the_old_engine_just_before_the_swap_still_runs(fresh_runtime):
    old = runtime.get_engine()
    config = ModelConfig.objects.create(name="swap", max_num_seqs=4, kv_cache_mb=256)
    config.activate()
    runtime.reload_engine(config, wait=True)
    assert runtime.get_engine() is not old
    # Queued on the old engine right after the swap, while it is idle: it still runs.
    [result] = old.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert (result.finish_reason, result.usage.completion_tokens) == ("length", 4)
    wait_for(lambda: not old._thread.is_alive(), 60, "the old engine's shut-down")
    with pytest.raises(EngineClosedError):
        old.submit("Hello")


async def api_key_header() -> dict[str, str]:
    user = await sync_to_async(User.objects.create_user)("aborted", is_staff=True)
    _, key = await sync_to_async(ApiKey.create_for)(user, "aborted")
    return {"Authorization": f"Bearer {key}"}


def long_request(stream: bool) -> str:
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
         "max_tokens": 2000, "ignore_eos": True, "temperature": 0, "stream": stream}
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
async def test_a_stream_the_engine_aborts_ends_with_a_clear_error(fresh_runtime) -> None:
    client, headers = AsyncClient(), await api_key_header()
    response = await client.post(
        "/v1/chat/completions", long_request(True), content_type="application/json",
        headers=headers,
    )  # fmt: skip
    assert response.status_code == 200
    chunks = aiter(response.streaming_content)
    first = sse_events(await anext(chunks))
    assert first[0]["choices"][0]["delta"]["role"] == "assistant"
    runtime.get_engine().shutdown()  # what the end of a drain period does to what still runs
    events = sse_events(b"".join([chunk async for chunk in chunks]))
    assert events[-1]["error"]["code"] == "engine_restarted", events[-3:]
    assert "[DONE]" not in events
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1] if e.get("choices"))


def sse_events(raw: bytes) -> list:
    return [
        line if line == "[DONE]" else json.loads(line)
        for line in (part.removeprefix("data: ") for part in raw.decode().split("\n\n"))
        if line.strip()
    ]


@pytest.mark.django_db(transaction=True)
async def test_a_request_the_engine_aborts_gets_503(fresh_runtime) -> None:
    client, headers = AsyncClient(), await api_key_header()
    request = asyncio.ensure_future(
        client.post(
            "/v1/chat/completions",
            long_request(False),
            content_type="application/json",
            headers=headers,
        )
    )
    engine = runtime.get_engine()
    while not engine.has_unfinished_requests():
        await asyncio.sleep(0.05)
    await asyncio.to_thread(engine.shutdown)
    response = await request
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "engine_restarted"
    assert response["Retry-After"] == "1"
