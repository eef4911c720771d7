"""chatsite.tasks: a Celery round trip through a real worker process on Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from chatsite.tasks import ping

ROOT = Path(__file__).resolve().parents[2]


def test_ping_runs_in_process_when_no_broker_is_configured() -> None:
    if settings.REDIS_URL:
        pytest.skip("only on the embedded defaults")
    result = ping.delay("hello").get(timeout=5)
    assert result["payload"] == "hello"
    assert result["pid"] == os.getpid()


@pytest.mark.integration
def test_ping_round_trips_through_a_worker_process_on_redis() -> None:
    if not settings.REDIS_URL:
        pytest.skip("runs in the integration pass (REDIS_URL=redis://...)")
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "chatsite", "worker",
            "--pool", "solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", "INFO",
        ],
        cwd=ROOT,
        env=os.environ | {"DJANGO_SETTINGS_MODULE": "tests.settings"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        result = ping.delay("through redis").get(timeout=90)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        log, _ = worker.communicate(timeout=30)
    assert result["payload"] == "through redis"
    assert result["pid"] != os.getpid()
    assert "chatsite.ping" in log
