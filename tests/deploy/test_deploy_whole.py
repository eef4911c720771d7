"""The whole deployment (README "Production"; issue 22, part 5): two daphne processes and a Celery
worker on PostgreSQL with pgvector and Redis, behind nginx on deploy/nginx.conf.

Each process has a data directory of its own, as on three hosts: nothing of the search index is
on disk, the vectors are pgvector's and BM25 is PostgreSQL's inverted index. Only the uploaded
files are shared (each data dir's `media` is the same directory), because the worker reads the
file a web process stored. Through nginx, at once: a few users chat over their WebSockets on the
real chat model, while a staff key uploads documents over the REST API for the worker to ingest.
Then each web process, asked directly, finds every document the worker ingested.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path

import pytest

from harness import ChatClient, LiveServer, TurnResult
from harness.celery_worker import start_worker, stop_worker
from tests.deploy.processes import NGINX, Nginx

pytestmark = [
    pytest.mark.integration,
    pytest.mark.real_weights,
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (CI installs nginx-light)"),
]

# NOTE: a database of its own on the shared Redis server (test_deploy_two_processes has 13).
REDIS_DB = 12
CHATS = 4  # half of them pinned to each web process
# Users to pick the chats from: nginx pins each session to a process by its cookie's hash, so
# which process a session lands on is chance; of 30, fewer than 2 land on one process about once
# in 10^5 runs even where the hash ring splits 60/40 (in 10^7 at 50/50).
USERS = 30
TURNS = 2
TURN_TIMEOUT_S = 180.0
INGESTION_TIMEOUT_S = 180.0
# Users with a greedy profile of short answers, searching one collection that holds a runbook.
SITE = {
    "label": "deploy",
    "users": USERS,
    "profile": {"temperature": 0.0, "max_tokens": 8, "search_top_k": 3},
    "document": {
        "title": "runbook.md",
        "file_name": "runbook.md",
        "text": "# Runbook\n\n"
        + "\n\n".join(f"## Step {i}\nRestart service {i} and check its log." for i in range(6)),
    },
    "api_key": True,
}
SETUP = """
import json
from django.contrib.auth.models import User
from harness.site import prepare_site

site = prepare_site(json.loads({spec!r}))
User.objects.filter(pk=site["api_user_id"]).update(is_staff=True)  # the key uploads documents
print(json.dumps(site))
"""
# Uploaded while the chats run: small documents, each with a code word only it holds.
CODE_WORDS = {
    "Arkwright": "quillfeather",
    "Belmonte": "saltmarrow",
    "Caradoc": "emberwick",
    "Dunmore": "frostlantern",
}
STATIONS = tuple(CODE_WORDS)
QUESTIONS = ("How do I restart service 2?", "What does step 4 say?")
# Lines of a process's log that say something went wrong (none is expected in this run).
LOG_ERRORS = ("Traceback", "Internal Server Error", "Exception inside application", "ERROR")
NGINX_ERRORS = ("[error]", "[crit]", "[alert]", "[emerg]")


def station_text(station: str) -> str:
    return (
        f"# {station} relay station\n\n"
        f"The {station} relay station opens its gate with the code word {CODE_WORDS[station]}.\n\n"
        f"## Maintenance\nThe {station} batteries are replaced every spring by the field team.\n"
    )


def http(url: str, method: str = "GET", *, key: str, body=None, headers=None) -> tuple[int, dict]:
    """(status, JSON body); never raises for an HTTP status."""
    headers = {"Authorization": f"Bearer {key}", **(headers or {})}
    if isinstance(body, dict):
        body, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def upload(base_url: str, key: str, collection_id: int, station: str) -> dict:
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="collection"\r\n\r\n'
        f'{collection_id}\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="{station.lower()}.md"\r\nContent-Type: text/markdown\r\n\r\n'
        f"{station_text(station)}\r\n--{boundary}--\r\n"
    ).encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    status, document = http(f"{base_url}/v1/documents", "POST", key=key, body=body, headers=headers)
    assert status == 201, document
    return document


def wait_until_ready(base_url: str, key: str, document_id: int) -> dict:
    deadline = time.monotonic() + INGESTION_TIMEOUT_S
    while time.monotonic() < deadline:
        status, document = http(f"{base_url}/v1/documents/{document_id}", key=key)
        assert status == 200, document
        if document["status"] in {"ready", "failed", "cancelled"}:
            return document
        time.sleep(0.5)
    raise AssertionError(f"document {document_id} not ingested in {INGESTION_TIMEOUT_S:.0f}s")


def load_documents(base_url: str, key: str, collection_id: int) -> list[dict]:
    """The staff's document load: every upload, then every ingestion to its end."""
    uploaded = [upload(base_url, key, collection_id, station) for station in STATIONS]
    return [wait_until_ready(base_url, key, document["id"]) for document in uploaded]


async def chat(client: ChatClient, index: int) -> list[TurnResult]:
    sock = await client.connect()
    results = [TurnResult(index, turn) for turn in range(1, TURNS + 1)]
    try:
        for turn, question in zip(results, QUESTIONS, strict=False):
            turn.conversation = results[0].conversation
            await client.turn(sock, turn, question, seed=index)
    finally:
        await sock.close()
    return results


def pinned_cookies(nginx: Nginx, web: tuple[LiveServer, ...], cookies: list[str]) -> list[str]:
    """CHATS // 2 session cookies that nginx pins to each web process: the first process's, then
    the second's.

    NOTE: a session's process is found through nginx: each process opens `/metrics` to its own
    token only, so the first process's token gets 200 from the first and 401 from the second.
    """
    by_process: list[list[str]] = [[] for _ in web]
    for cookie in cookies:
        headers = {"Cookie": cookie, "Authorization": f"Bearer {web[0].metrics_token}"}
        request = urllib.request.Request(f"{nginx.url}/metrics", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        assert status in {200, 401}, status
        by_process[0 if status == 200 else 1].append(cookie)
    half = CHATS // 2
    assert min(map(len, by_process)) >= half, [len(found) for found in by_process]
    return [cookie for found in by_process for cookie in found[:half]]


def health(base_url: str) -> dict:
    try:
        with urllib.request.urlopen(f"{base_url}/healthz", timeout=30) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        return json.loads(error.read())


def vectors_and_postings(report: dict) -> tuple[int, int]:
    """How many chunks /healthz says have a vector ("N vectors of ...") and postings
    ("postgresql inverted index (N chunks)")."""
    components = report["components"]
    vectors = re.match(r"(\d+) vectors", components["search_index"]["detail"])
    indexed = re.search(r"\((\d+) chunks\)", components["lexical_store"]["detail"])
    assert vectors and indexed, components
    return int(vectors[1]), int(indexed[1])


def faiss_files(directory: Path) -> list[str]:
    """Any faiss index file under `directory` (links, the shared model cache, not followed)."""
    return [
        os.path.join(root, name)
        for root, _, names in os.walk(directory)
        for name in names
        if ".faiss" in name
    ]


def log_errors(text: str, markers: tuple[str, ...]) -> list[str]:
    return [line for line in text.splitlines() if any(marker in line for marker in markers)]


def host_like(prepared: LiveServer, live: LiveServer) -> None:
    """`live`'s data dir as another host's after its set-up: the models (the shared cache, as
    LiveServer links it) and the collected static files; the database is migrated already."""
    (live.data_dir / "models").symlink_to((prepared.data_dir / "models").resolve())
    shutil.copytree(prepared.data_dir / "static", live.data_dir / "static", symlinks=True)


@pytest.fixture
def redis_url(settings):
    if not settings.REDIS_URL:
        pytest.skip("runs in the integration pass (REDIS_URL=redis://...)")
    import redis

    url = f"{settings.REDIS_URL.rsplit('/', 1)[0]}/{REDIS_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()  # NOTE: an interrupted earlier run's queued tasks are not this run's
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def deploy_database(redis_url, request):
    """A database of its own on the bundled PostgreSQL with pgvector; dropped afterwards.

    NOTE: the server is asked for after `redis_url`, so the default pass skips before starting it.
    """
    import psycopg

    bundled_postgres = request.getfixturevalue("bundled_postgres")

    name = f"cachet_deploy_{os.getpid()}"
    with psycopg.connect(bundled_postgres.url(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    yield bundled_postgres.url(name)
    with psycopg.connect(bundled_postgres.url(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_two_web_processes_and_a_worker_behind_nginx_serve_chats_while_documents_ingest(
    chat_model_dir, redis_url, deploy_database, tmp_path
) -> None:
    media = tmp_path / "media"  # the one shared directory: uploaded files
    media.mkdir()
    options = {
        "models_dir": chat_model_dir.parent,
        "database_url": deploy_database,
        "redis_url": redis_url,
        "torch_threads": 1,
        # NOTE: one 4,096-token sequence: 90 MiB in bf16, 180 in float32 (CPUs without BF16)
        "kv_cache_mb": 256,
        # NOTE: one secret key everywhere, as in production, so a session holds on any process.
        # The stores forced: without pgvector a process stops at start instead of keeping faiss.
        "env": {
            "CACHET_SECRET_KEY": "deploy-test-" + uuid.uuid4().hex * 2,
            "CACHET_VECTOR_STORE": "pgvector",
            "CACHET_LEXICAL_STORE": "postgresql",
        },
    }
    with ExitStack() as stack:
        first = stack.enter_context(LiveServer(**options))  # migrates the database
        second, worker_host = LiveServer(**options), LiveServer(**options)
        for live in (second, worker_host):
            stack.callback(live.close)
            host_like(first, live)
        web = (first, second)
        for live in (*web, worker_host):
            (live.data_dir / "media").symlink_to(media, target_is_directory=True)
        site = json.loads(first.shell(SETUP.format(spec=json.dumps(SITE))).splitlines()[-1])
        key, collection_id = site["api_key"], site["collection_ids"][0]
        worker = start_worker(worker_host.env, tmp_path / "worker.log")
        stack.callback(stop_worker, worker)
        await asyncio.gather(*(asyncio.to_thread(live.start) for live in web))

        for live in web:  # the stores each process chose, before any search loaded them
            components = health(live.url)["components"]
            assert components["lexical_store"]["detail"].startswith("postgresql"), components

        nginx = Nginx(tmp_path / "nginx", [first.port, second.port])
        stack.callback(nginx.stop)
        nginx.start()

        sessions = [f"{site['cookie_name']}={session}" for session in site["sessions"]]
        cookies = pinned_cookies(nginx, web, sessions)
        profile = site["profile_id"]
        clients = [
            ChatClient(nginx.port, cookie, profile, [collection_id], TURN_TIMEOUT_S)
            for cookie in cookies
        ]
        started = time.monotonic()
        documents, *chats = await asyncio.gather(
            asyncio.to_thread(load_documents, nginx.url, key, collection_id),
            *(chat(client, index) for index, client in enumerate(clients)),
        )
        load_s = time.monotonic() - started

        # --- every chat answered, every document ingested by the worker ---
        for turns in chats:
            for turn in turns:
                assert turn.error is None, (turn, first.log_tail(), second.log_tail())
                assert turn.finish_reason in {"length", "stop"} and turn.answer, turn
                assert turn.num_sources > 0, turn  # the runbook, found by each process
        assert [d["status"] for d in documents] == ["ready"] * len(STATIONS), documents
        worker_log = (tmp_path / "worker.log").read_text(errors="replace")
        ingested = re.findall(r"retrieval\.ingest_document\[[^]]*\] succeeded in", worker_log)
        assert len(ingested) == len(STATIONS), worker_log[-3000:]

        # --- either process, asked directly, finds what the worker wrote to PostgreSQL ---
        for live in web:
            for station, document in zip(STATIONS, documents, strict=True):
                query = {"query": CODE_WORDS[station], "collections": [collection_id], "top_k": 3}
                status, hits = http(f"{live.url}/v1/search", "POST", key=key, body=query)
                assert status == 200, hits
                found = [hit["document_id"] for hit in hits["data"]]
                assert found and found[0] == document["id"], (live.url, station, hits)
        reports = [health(live.url) for live in web]
        for report in reports:
            assert report["status"] == "ok", report
            components = report["components"]
            assert "pgvector" in components["search_index"]["detail"], components
            assert components["lexical_store"]["detail"].startswith("postgresql inverted index"), (
                components
            )
        # The same rows in both, each chunk with its vector and its postings: the seed
        # runbook's chunks, which a shell ingested, and at least one of every upload's.
        counts = {(vectors_and_postings(report)) for report in reports}
        assert len(counts) == 1, reports
        ((num_vectors, num_indexed),) = counts
        assert num_vectors == num_indexed >= site["document_chunks"] + len(STATIONS), reports
        served = [live.engine_metrics().get("requests", 0) for live in web]
        assert served == [CHATS // 2 * TURNS] * 2, served  # each chat stayed on its process

        nginx.stop()
        stop_worker(worker)
        for live in web:
            live.stop()
        for directory in (*(live.data_dir for live in web), worker_host.data_dir):
            assert faiss_files(directory) == [], directory
        for live in web:
            assert log_errors(live.log_tail(10**7), LOG_ERRORS) == [], live.log_tail()
        worker_log = (tmp_path / "worker.log").read_text(errors="replace")  # and its shutdown
        assert log_errors(worker_log, LOG_ERRORS) == [], worker_log[-3000:]
        assert log_errors(nginx.error_log.read_text(), NGINX_ERRORS) == []
        access = nginx.access_log.read_text().splitlines()
        assert not [line for line in access if '" 5' in line], access

    print(
        f"deployment: {CHATS} chats x {TURNS} turns and {len(STATIONS)} uploads in {load_s:.1f}s;"
        f" turns served per web process {served}"
    )
