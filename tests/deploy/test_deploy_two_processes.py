"""The multi-process deployment (deploy/, README "Production"): two daphne processes on one Redis
channel layer and one database, and a Celery worker process that ingests a document.

A staff browser's progress socket is open on each server process; the worker (a third process,
as on another host) reports the ingestion's progress to the document's channel group, and both
sockets receive every report. The nginx configuration is checked with `nginx -t` where nginx is
installed.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import subprocess

import pytest

from harness import CLOSED, ChatSocket, LiveServer
from harness.celery_worker import start_worker, stop_worker
from harness.live_server import REPO_DIR

SETUP = """
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.test import Client
from retrieval.models import Collection, Document

staff = User.objects.create_user("operator", is_staff=True)
collection = Collection.objects.create(name="Ops")
steps = (f"## Step {i}\\nRestart service {i} and check it." for i in range(12))
text = "# Runbook\\n\\n" + "\\n\\n".join(steps)
document = Document.objects.create(
    collection=collection, title="runbook.md", file=ContentFile(text.encode(), name="runbook.md")
)
client = Client()
client.force_login(staff)
print(document.pk, client.cookies["sessionid"].value)
"""
# NOTE: a database of its own on the shared Redis server, so no other test's keys meet ours.
REDIS_DB = 13
INGESTION_TIMEOUT_S = 180.0


@pytest.fixture
def redis_url(settings) -> str:
    if not settings.REDIS_URL:
        pytest.skip("runs in the integration pass (REDIS_URL=redis://...)")
    return f"{settings.REDIS_URL.rsplit('/', 1)[0]}/{REDIS_DB}"


def send_ingest(broker_url: str, document_id: int) -> None:
    from chatsite.celery import app

    # NOTE: send_task publishes to this broker even where tasks would run in-process.
    with app.connection_for_write(broker_url) as connection:
        app.send_task("retrieval.ingest_document", args=[document_id], connection=connection)


async def frames_until_ready(sock: ChatSocket) -> list[dict]:
    frames = []
    while not frames or frames[-1].get("status") not in {"ready", "failed"}:
        frame = await asyncio.wait_for(sock.frames.get(), INGESTION_TIMEOUT_S)
        assert frame is not CLOSED, f"the socket closed: {sock.close_info}"
        frames.append(frame)
    return frames


@pytest.mark.integration
@pytest.mark.real_weights
async def test_progress_from_a_worker_reaches_sockets_on_both_server_processes(
    chat_model_dir, redis_url, tmp_path
) -> None:
    shared = {
        "database_url": f"sqlite:///{tmp_path / 'shared.sqlite3'}",
        "redis_url": redis_url,
        "torch_threads": 1,
        # NOTE: one 4,096-token sequence: 90 MiB in bf16, 180 in float32 (CPUs without BF16)
        "kv_cache_mb": 256,
        # NOTE: one secret key everywhere, as in production, so a session holds on any process.
        "env": {"CACHET_SECRET_KEY": secrets.token_urlsafe(50)},
    }
    models_dir = chat_model_dir.parent
    with (
        LiveServer(models_dir=models_dir, **shared) as first,
        LiveServer(models_dir=models_dir, **shared) as second,
    ):
        document_id, session = first.shell(SETUP).split()
        first.start()
        second.start()
        sockets = [
            await ChatSocket.connect(
                live.port,
                f"/ws/documents/{document_id}/progress/",
                {"Origin": live.url, "Cookie": f"sessionid={session}"},
            )
            for live in (first, second)
        ]
        for sock in sockets:  # the current state on connect: subscribed from here on
            frame = await asyncio.wait_for(sock.frames.get(), 30)
            assert frame is not CLOSED and frame["status"] == "queued", sock.close_info

        worker = start_worker(first.env, tmp_path / "worker.log")
        try:
            await asyncio.to_thread(send_ingest, redis_url, int(document_id))
            received = await asyncio.gather(*(frames_until_ready(sock) for sock in sockets))
        finally:
            stop_worker(worker)
            for sock in sockets:
                await sock.close()

    on_first, on_second = received
    assert on_first == on_second, (on_first, on_second)
    assert on_first[-1]["status"] == "ready" and on_first[-1]["progress"] == 100
    progress = [frame["progress"] for frame in on_first]
    assert any(frame["status"] == "processing" for frame in on_first)
    assert progress == sorted(progress) and len(progress) >= 3


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
def test_the_sample_nginx_configuration_is_valid(tmp_path) -> None:
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n  client_body_temp_path {tmp_path}/body;\n  proxy_temp_path {tmp_path}/proxy;\n"
        f"  include {REPO_DIR / 'deploy' / 'nginx.conf'};\n}}\n"
    )
    result = subprocess.run(
        ["nginx", "-t", "-c", str(main), "-p", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "syntax is ok" in result.stderr
