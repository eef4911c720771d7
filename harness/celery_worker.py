"""A Celery worker as a subprocess its caller owns (tests, benches): started, waited for, stopped.

The solo pool runs one task at a time in the worker's own process, as the deployment's
`--concurrency 1` does (deploy/systemd/cachet-worker.service), so a setting applied at start
(torch threads) is the one its tasks run with. The worker has a session of its own, so stopping
it stops whatever it started too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.live_server import REPO_DIR

STOP_TIMEOUT_S = 30.0


def start_worker(
    env: dict[str, str], log_path: Path, name: str | None = None
) -> subprocess.Popen[bytes]:
    """`name`: the worker's node name (`--hostname`), for several workers on one host."""
    node = ["--hostname", name] if name else []
    with log_path.open("ab") as log:  # NOTE: a file: a full pipe would stall the worker
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "chatsite", "worker", "--pool", "solo", *node,
             "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
            cwd=REPO_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def wait_until_ready(worker: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> None:
    """Wait for the worker's "ready." line: logged after its `worker_ready` receivers ran (the
    retrieval app builds its retriever there, so the embedding model is loaded by then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        if " ready." in log:
            return
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited ({worker.returncode}): {log[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"the worker was not ready in {timeout_s:.0f}s: {log[-3000:]}")


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a warm shutdown: the running task finishes), then SIGKILL after 30 s."""
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
