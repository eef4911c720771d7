"""A real Cachet server in a subprocess, on a throwaway data dir: for browser tests and benchmarks.

`LiveServer` migrates a fresh SQLite database (or the `database_url` given), lets the caller set
up data with `shell()` or `call()` before the server starts (so the server's search index sees
it), then runs daphne on a free port and waits until `/healthz` reports the engine ready. The chat
model cache of the current data dir is shared (symlinked), so nothing is converted twice.

The server runs on its own settings, whatever this process uses: DATABASE_URL, REDIS_URL and
CACHET_DEBUG of the calling shell are dropped (pass `database_url` / `redis_url` to use one), the
engine starts with the server, and `/metrics` opens to the server's `metrics_token`.

    with LiveServer(models_dir=..., env={"CACHET_KV_CACHE_MB": "1024"}) as live:
        key = live.shell("...; print(raw_key)").strip()  # or live.call("pkg.mod:setup", spec)
        live.start()
        ...  # live.url, live.metrics(), live.log_tail()

`stop()` (SIGTERM) and `kill()` (SIGKILL, as a crash) keep the data dir; `start()` then runs a
new server on it, on the same port.
"""

from __future__ import annotations

import atexit
import importlib
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
from typing import Any

logger = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_CHARS = 3000
# The default database's file in a data dir (chatsite/settings.py).
SQLITE_NAME = "cachet.sqlite3"
# Environment of the calling shell that never reaches the server (see the module doc).
DROPPED_ENV = frozenset({"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "CACHET_DEBUG"})
# Marks the line of `call()`'s result in the shell's output (whatever else the code prints).
RESULT_MARKER = "live-server-result:"
# The engine's counters that `engine_metrics()` reports, by their short names.
ENGINE_SERIES = {
    "cachet_engine_prompt_tokens_total": "prompt_tokens",
    "cachet_engine_cached_prompt_tokens_total": "cached_prompt_tokens",
    "cachet_engine_generation_tokens_total": "generation_tokens",
    "cachet_engine_preemptions_total": "preemptions",
    "cachet_engine_requests_total": "requests",
}


class LiveServerError(RuntimeError):
    """The server did not start, or a command failed; the message ends with the output's tail."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def default_models_dir() -> Path:
    """The models cache of the data dir this shell uses (where `make run` and the tests put it)."""
    data_dir = os.environ.get("CACHET_DATA_DIR") or str(REPO_DIR / "var")
    return Path(data_dir).expanduser().resolve() / "models"


def _call_main(target: str, args_json: str) -> None:
    """Runs in the Django shell of `LiveServer.call`: `module:function(*args)`, printed as JSON."""
    module, _, name = target.partition(":")
    result = getattr(importlib.import_module(module), name)(*json.loads(args_json))
    sys.stdout.write(f"\n{RESULT_MARKER}{json.dumps(result)}\n")


_template_dir: Path | None = None


def _prepared_sqlite_template() -> Path:
    """A data dir holding a migrated SQLite database and the collected static files, made once
    per process (in a temporary directory, so it always matches the code under test)."""
    global _template_dir
    if _template_dir is None or not (_template_dir / SQLITE_NAME).is_file():
        template = LiveServer()
        atexit.register(template.close)
        template._migrate_and_collect_static()
        _template_dir = template.data_dir
    return _template_dir


class LiveServer:
    """`with LiveServer() as server: server.shell(...); server.start(); ...` (see module doc)."""

    def __init__(
        self,
        *,
        models_dir: Path | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
        database_url: str | None = None,
        redis_url: str | None = None,
        torch_threads: int | None = None,
        kv_cache_mb: int | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        """`env`: extra variables for the server and its commands, applied last.

        `torch_threads`, `kv_cache_mb`: CACHET_TORCH_THREADS and CACHET_KV_CACHE_MB (None: the
        settings' defaults, one thread per core and 512 MB).

        `database_url`: a THROWAWAY database (it is migrated, and the caller's rows stay in it);
        default: a fresh SQLite file in the data dir. `redis_url`: the channel layer's and the
        task broker's Redis; default: in-memory layer, in-process tasks.
        """
        self.data_dir = Path(tempfile.mkdtemp(prefix="cachet-live-"))
        self.port = port or free_port()
        self.log_path = self.data_dir / "server.log"
        self.database_url = database_url
        self.redis_url = redis_url
        self.torch_threads = torch_threads
        self.kv_cache_mb = kv_cache_mb
        self.ready_timeout_s = ready_timeout_s
        self.metrics_token = secrets.token_urlsafe(24)
        # NOTE: one key for the server and every command, so sessions made in `shell()` hold.
        self._secret_key = secrets.token_urlsafe(50)
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
    def pid(self) -> int | None:
        """The server process's id while it runs (for CPU or memory readings), else None."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    @property
    def env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key not in DROPPED_ENV}
        env |= {
            "CACHET_DATA_DIR": str(self.data_dir),
            "CACHET_SECRET_KEY": self._secret_key,
            "CACHET_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "CACHET_START_ENGINE": "1",
            "CACHET_METRICS_TOKEN": self.metrics_token,
            "DJANGO_SETTINGS_MODULE": "chatsite.settings",
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if self.database_url:
            env["DATABASE_URL"] = self.database_url
        if self.redis_url:
            env["REDIS_URL"] = self.redis_url
        if self.torch_threads is not None:
            env["CACHET_TORCH_THREADS"] = str(self.torch_threads)
        if self.kv_cache_mb is not None:
            env["CACHET_KV_CACHE_MB"] = str(self.kv_cache_mb)
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
        """Share the model cache, migrate the database and collect static files (as `make run`).

        NOTE: on the default SQLite database both come from a copy of what the first server of
        this process prepared (`_prepared_sqlite_template`): the same migrations and files, made
        once instead of two Django start-ups (~10 s) per server.
        """
        if self._models_dir is not None and self._models_dir.is_dir():
            (self.data_dir / "models").symlink_to(self._models_dir.resolve())
        if self.database_url:
            self._migrate_and_collect_static()
            return
        template = _prepared_sqlite_template()
        shutil.copy2(template / SQLITE_NAME, self.data_dir / SQLITE_NAME)
        shutil.copytree(template / "static", self.data_dir / "static", symlinks=True)

    def _migrate_and_collect_static(self) -> None:
        self.shell(
            "from django.core.management import call_command\n"
            "call_command('migrate', interactive=False, verbosity=0)\n"
            "call_command('collectstatic', interactive=False, verbosity=0)\n"
        )

    def manage(self, *args: str, timeout: float = 600) -> str:
        """Run a management command against the server's database; return its stdout."""
        try:
            result = subprocess.run(
                [sys.executable, str(REPO_DIR / "manage.py"), *args],
                env=self.env,
                cwd=REPO_DIR,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise LiveServerError(f"manage.py {args[0]} took over {timeout:.0f}s") from None
        if result.returncode != 0:
            raise LiveServerError(f"manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def shell(self, code: str, *, timeout: float = 600) -> str:
        """Run Python code in a Django shell of the server's settings; return its stdout."""
        return self.manage("shell", "--no-imports", "-c", code, timeout=timeout)

    def call(self, target: str, *args: Any, timeout: float = 600) -> Any:
        """`module:function(*args)` in a Django shell of the server's settings; its JSON result.

        Arguments and result go through JSON. Setup code can live as a plain function in a module
        (linted and tested like any other) instead of a code string.
        """
        code = (
            "from harness.live_server import _call_main\n"
            f"_call_main({target!r}, {json.dumps(args)!r})\n"
        )
        output = self.shell(code, timeout=timeout)
        for line in reversed(output.splitlines()):
            if line.startswith(RESULT_MARKER):
                return json.loads(line.removeprefix(RESULT_MARKER))
        raise LiveServerError(f"{target} printed no result:\n{output[-3000:]}")

    def start(self, *, timeout_s: float | None = None) -> None:
        """Start daphne and wait (`timeout_s`, default `ready_timeout_s`) until it is healthy."""
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
             "chatsite.asgi:application"],
            env=self.env,
            cwd=REPO_DIR,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        logger.info("live server starting on %s (pid %d)", self.url, self._process.pid)
        self._wait_until_ready(self.ready_timeout_s if timeout_s is None else timeout_s)

    def _wait_until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
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
            engine = body.get("components", {}).get("engine", {}).get("detail", "")
            # NOTE: the detail reads "RuntimeError: error: loading ... failed: ..." then; no
            # point waiting for an engine that will not come.
            if engine.partition(": ")[2].startswith("error"):
                raise LiveServerError(f"the engine failed to load: {engine}{self._tail()}")
            last = json.dumps(body.get("components", body))[:500]
            time.sleep(0.2)
        raise LiveServerError(f"not ready after {timeout_s:.0f}s: {last}{self._tail()}")

    def metrics_text(self) -> str:
        """`/metrics` of the running server (Prometheus text), read with the metrics token."""
        request = urllib.request.Request(
            f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.metrics_token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read().decode()

    def metrics(self) -> dict[str, float]:
        """`/metrics` as {sample name: value summed over its labels}; {} if it cannot be read."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            text = self.metrics_text()
        except (urllib.error.URLError, OSError) as error:
            logger.warning("could not read /metrics: %s", error)
            return {}
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    def engine_metrics(self) -> dict[str, int]:
        """The engine's counters (`ENGINE_SERIES`, summed over labels); {} if unreadable."""
        metrics = self.metrics()
        return {key: int(metrics[name]) for name, key in ENGINE_SERIES.items() if name in metrics}

    def log_tail(self, num_chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the server's log (stdout and stderr); "" if there is none."""
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""

    def _tail(self) -> str:
        tail = self.log_tail()
        return f"\n--- server log ---\n{tail}" if tail else ""

    def stop(self) -> None:
        """Stop the server (data dir kept: `manage()`, `shell()` and `call()` still work)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning("the server did not stop in %.0fs; killing it", STOP_TIMEOUT_S)
                self._process.kill()
                self._process.wait()
        self._release()

    def kill(self) -> None:
        """Kill the server with SIGKILL, as a crash would: no clean-up runs in it.

        The data dir is kept, as by `stop()`: `start()` runs a new server on the same data dir
        (and port), which is how the reliability tests restart a killed server.
        """
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._release()

    def _release(self) -> None:
        self._process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
