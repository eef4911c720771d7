"""Faults: Redis stopped under a running server, then started again on the same port.

A LiveServer runs with REDIS_URL pointing at a throwaway redis-server of the test's own (the
shared Redis is never stopped): Redis is its channel layer, task broker and rate-limit store.

While Redis is down: /healthz answers 503 within seconds, naming `channel_layer` and `broker`;
the REST API still answers (rate limits fail open, with a warning); chat sockets, open or new,
still answer (the chat uses no channel layer); an upload (REST API or chat page) gets 503
`queue_unavailable` at once and leaves no document behind; a progress socket is closed with 4503
(unavailable) and the page falls back to polling. Once Redis is back, everything works again
without a restart: health is ok, uploads are queued in Redis, rate limits are counted in Redis
again, progress sockets work. Before and after, a socket idle longer than redis-py's 5 s read
timeout stays open.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import urllib.error
import urllib.request
import uuid

import pytest

from harness import CLOSED, ChatClient, ChatSocket, LiveServer, TurnResult
from tests.reliability.helpers import ThrowawayRedis, wait_for

pytestmark = pytest.mark.real_weights

MODEL = "smollm2-135m-instruct"
SETUP = """
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.test import Client
from api.models import ApiKey
from retrieval.models import Collection, Document

staff = User.objects.create_user("operator", is_staff=True)
collection = Collection.objects.create(name="Ops")
document = Document.objects.create(
    collection=collection, title="notes.txt", file=ContentFile(b"Notes.", name="notes.txt"),
    status="ready", progress=100,
)
_, key = ApiKey.create_for(staff, "ops")
client = Client()
client.force_login(staff)
print(collection.pk, document.pk, key, client.cookies["sessionid"].value)
"""
# A chat user and a greedy profile (harness.site), for the turns around the outage.
SITE = {"label": "outage", "profile": {"temperature": 0.0, "max_tokens": 8, "search_top_k": 3}}
# Longer than redis-py's default read timeout (5 s), which the channel layer's waits hit.
IDLE_S = 7.0
HEALTH_LIMIT_S = 5.0
TURN_TIMEOUT_S = 120.0


def request(live, method: str, path: str, *, key: str | None = None, body=None, headers=None):
    """(status, JSON body or text, seconds); never raises for an HTTP status."""
    headers = dict(headers or {})
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if isinstance(body, dict):
        body, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    started = time.monotonic()
    call = urllib.request.Request(f"{live.url}{path}", data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(call, timeout=60) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        content = json.loads(raw)
    except ValueError:
        content = raw.decode(errors="replace")
    return status, content, time.monotonic() - started


def multipart(collection_id: str) -> tuple[bytes, dict[str, str]]:
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="collection"\r\n\r\n'
        f'{collection_id}\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="memo.txt"\r\nContent-Type: text/plain\r\n\r\nA memo.\r\n--{boundary}--\r\n'
    ).encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def upload(live, key: str, collection_id: str):
    """An upload over the REST API."""
    body, headers = multipart(collection_id)
    return request(live, "POST", "/v1/documents", key=key, body=body, headers=headers)


def upload_in_chat(live, session: str, collection_id: str):
    """An upload from the chat page (session and CSRF token, as the page sends it)."""
    body, headers = multipart(collection_id)
    token = secrets.token_hex(16)  # a CSRF secret of the cookie's length; the header repeats it
    headers |= {"Cookie": f"sessionid={session}; csrftoken={token}", "X-CSRFToken": token}
    return request(live, "POST", "/chat/api/documents/", body=body, headers=headers)


def chat_completion(live, key: str):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return request(live, "POST", "/v1/chat/completions", key=key, body=body)


async def turn(client: ChatClient, sock: ChatSocket, text: str) -> TurnResult:
    result = TurnResult(0, 1)
    await client.turn(sock, result, text, seed=1)
    assert result.error is None, result.error
    assert result.finish_reason in {"length", "stop"}
    return result


async def progress_socket(live, cookie: str, document_id: str) -> tuple[list[dict], tuple]:
    """Open a document's progress socket; the frames it got in a second, and how it closed."""
    headers = {"Origin": live.url, "Cookie": cookie}
    sock = await asyncio.wait_for(
        ChatSocket.connect(live.port, f"/ws/documents/{document_id}/progress/", headers), 10
    )
    frames = []
    try:
        while True:
            frame = await asyncio.wait_for(sock.frames.get(), 1.0)
            if frame is CLOSED:
                break
            frames.append(frame)
    except TimeoutError:
        pass
    await sock.close()
    return frames, sock.close_info


def assert_healthy(live) -> None:
    status, report, _ = request(live, "GET", "/healthz")
    assert status == 200 and report["status"] == "ok", report


@pytest.fixture
def redis_server(tmp_path):
    with ThrowawayRedis(tmp_path) as server:
        yield server


@pytest.fixture
def live(chat_model_dir, redis_server):
    server_options = {"redis_url": redis_server.url, "torch_threads": 1}
    with LiveServer(models_dir=chat_model_dir.parent, **server_options) as server:
        server.setup = server.shell(SETUP).split()
        server.site = server.call("harness.site:prepare_site", SITE)
        server.start()
        yield server


async def test_a_redis_outage_gives_clear_errors_and_recovers_without_a_restart(
    live, redis_server
) -> None:
    collection_id, document_id, key, staff_session = live.setup
    staff_cookie = f"sessionid={staff_session}"
    site = live.site
    chat = ChatClient(
        live.port, f"{site['cookie_name']}={site['sessions'][0]}", site["profile_id"], [],
        TURN_TIMEOUT_S,
    )  # fmt: skip

    # --- up: a socket idle past redis-py's read timeout still answers ---
    assert_healthy(live)
    kept = await chat.connect()
    await asyncio.sleep(IDLE_S)
    await turn(chat, kept, "Hello before the outage")
    frames, _ = await progress_socket(live, staff_cookie, document_id)
    assert frames and frames[0]["status"] == "ready"

    # --- down ---
    redis_server.stop()
    status, report, seconds = request(live, "GET", "/healthz")
    assert status == 503 and report["status"] == "error"
    components = report["components"]
    assert components["channel_layer"]["state"] == "error", components
    assert components["broker"]["state"] == "error", components
    assert "connect" in components["broker"]["detail"].lower()
    for name in ("database", "chat_model", "engine", "embedding_model"):
        assert components[name]["state"] == "ok", components
    assert seconds < HEALTH_LIMIT_S

    status, answer, _ = chat_completion(live, key)
    assert status == 200 and answer["choices"][0]["finish_reason"] in {"length", "stop"}
    await turn(chat, kept, "Hello during the outage")  # the socket opened before
    fresh = await chat.connect()
    await turn(chat, fresh, "A new chat during the outage")
    await fresh.close()

    status, error, seconds = upload(live, key, collection_id)
    assert status == 503, error
    assert error["error"]["code"] == "queue_unavailable"
    assert "broker is unreachable" in error["error"]["message"]
    assert seconds < 10
    status, error, seconds = upload_in_chat(live, staff_session, collection_id)
    assert status == 503 and error["error"]["code"] == "queue_unavailable", error
    assert seconds < 10
    status, listing, _ = request(live, "GET", "/v1/documents", key=key)
    assert [d["title"] for d in listing["data"]] == ["notes.txt"]  # nothing half-made

    frames, close_info = await progress_socket(live, staff_cookie, document_id)
    assert frames == [] and close_info[0] == 4503, live.log_tail()

    # --- back, on the same port: no restart of the server ---
    redis_server.start()
    wait_for(
        lambda: request(live, "GET", "/healthz")[0] == 200, 30, "healthy again", interval_s=0.5
    )
    assert_healthy(live)
    status, document, _ = upload(live, key, collection_id)
    assert status == 201 and document["status"] == "queued"
    status, answer, _ = upload_in_chat(live, staff_session, collection_id)
    assert status == 201 and answer["document"]["status"] == "queued", answer
    assert redis_server.client().llen("celery") == 2  # the ingestion tasks, for a worker
    status, _, _ = chat_completion(live, key)
    assert status == 200
    assert redis_server.client().keys("cachet:rl:*")  # rate limits counted in Redis again
    frames, _ = await progress_socket(live, staff_cookie, document["id"])
    assert frames and frames[0]["status"] == "queued", live.log_tail()
    await turn(chat, kept, "Hello after the outage")
    await asyncio.sleep(IDLE_S)
    await turn(chat, kept, "Still there?")
    await kept.close()

    log = live.log_tail(200_000)
    assert "rate limits not enforced" in log
    assert "progress socket closed: the channel layer is unreachable" in log
    assert "Internal Server Error" not in log
    assert "Exception inside application" not in log
