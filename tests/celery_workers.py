"""Celery worker processes for tests: started on a test database and a broker of the test's own,
stopped (or killed) with their children, sent tasks on that broker only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker_env(settings, data_dir: Path, broker_url: str, **extra: str) -> dict[str, str]:
    """A worker's environment: the test database (PostgreSQL), `data_dir`, `broker_url`."""
    db = settings.DATABASES["default"]
    return os.environ | {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "CACHET_DATA_DIR": str(data_dir),
        # NOTE: the worker must see the test database, which pytest-django created with a prefix.
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": broker_url,
        **extra,
    }


def start_worker(env: dict[str, str], log_path: Path, *pool: str) -> subprocess.Popen:
    # NOTE: the log goes to a file: a full pipe would stall the worker.
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "chatsite", "worker", *pool,
             "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def stop_worker(worker: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, sig)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def send_ingest(broker_url: str, document_id: int) -> None:
    from chatsite.celery import app

    # NOTE: send_task publishes even where tasks would run in-process, and to this broker only.
    with app.connection_for_write(broker_url) as connection:
        app.send_task("retrieval.ingest_document", args=[document_id], connection=connection)
