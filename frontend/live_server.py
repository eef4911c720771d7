"""A real Cachet server in a subprocess, on a throwaway data dir: for browser tests and benchmarks.

`LiveServer` migrates a fresh SQLite database (or the given DATABASE_URL), lets the caller set up
data with `shell()` before the server starts (so the server's search index sees it), then runs
daphne on a free port and waits until `/healthz` reports the engine ready. The chat model cache of
the current data dir is shared (symlinked), so nothing is converted twice.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0


class LiveServerError(RuntimeError):
    """The server did not start; the message ends with its log's tail."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LiveServer:
    """`with LiveServer() as server: server.shell(...); server.start(); ...` (see module doc)."""

    def __init__(
        self,
        *,
        models_dir: Path | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="cachet-live-"))
        self.port = port or free_port()
        self.log_path = self.data_dir / "server.log"
        self._models_dir = models_dir
        self._env_overrides = env or {}
        self._process: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}
        }
        env |= {
            "CACHET_DATA_DIR": str(self.data_dir),
            "CACHET_SECRET_KEY": secrets.token_urlsafe(50),
            "CACHET_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DJANGO_SETTINGS_MODULE": "chatsite.settings",
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        return env | self._env_overrides

    def __enter__(self) -> LiveServer:
        try:
            self.prepare()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def prepare(self) -> None:
        """Share the model cache, migrate the database and collect static files (as `make run`)."""
        if self._models_dir is not None and self._models_dir.is_dir():
            (self.data_dir / "models").symlink_to(self._models_dir.resolve())
        self.manage("migrate", "--noinput", "--verbosity", "0")
        self.manage("collectstatic", "--noinput", "--verbosity", "0")

    def manage(self, *args: str, timeout: float = 600) -> str:
        """Run a management command against the server's database; return its stdout."""
        result = subprocess.run(
            [sys.executable, str(REPO_DIR / "manage.py"), *args],
            env=self.env,
            cwd=REPO_DIR,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise LiveServerError(f"manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def shell(self, code: str, *, timeout: float = 600) -> str:
        """Run Python code in a Django shell of the server's settings; return its stdout."""
        return self.manage("shell", "--no-imports", "-c", code, timeout=timeout)

    def start(self) -> None:
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
             "chatsite.asgi:application"],
            env=self.env,
            cwd=REPO_DIR,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise LiveServerError(
                    f"the server exited ({self._process.returncode}){self._tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as response:
                    body = json.load(response)
            except urllib.error.HTTPError as error:  # 503 while the model loads
                body = json.loads(error.read() or b"{}")
            except (OSError, ValueError) as error:
                last = str(error)
                time.sleep(0.2)
                continue
            if body.get("status") == "ok":
                return
            last = json.dumps(body.get("components", body))[:500]
            time.sleep(0.2)
        raise LiveServerError(f"not ready after {READY_TIMEOUT_S:.0f}s: {last}{self._tail()}")

    def _tail(self, num_chars: int = 3000) -> str:
        try:
            return "\n--- server log ---\n" + self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        shutil.rmtree(self.data_dir, ignore_errors=True)
