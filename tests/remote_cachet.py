"""A second Cachet server as the remote OpenAI-compatible backend of the backends and chat tests.

`start_remote_cachet` runs a real server process (harness.live_server) serving the bundled model
under another name (its directory path, through CACHET_MODEL), so a request for the remote model
can never be answered by this process's own engine by mistake. It has an API key (`live.key`) and
a metrics token; tests that kill it start it again before they end. The `remote_cachet` fixture
(tests/conftest.py) keeps one for the session.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backends.models import InferenceBackend
from harness.live_server import LiveServer, free_port

API_KEY_SETUP = """
from django.contrib.auth.models import User
from api.models import ApiKey
_, key = ApiKey.create_for(User.objects.create_user("upstream"), "upstream")
print(key)
"""


@contextmanager
def start_remote_cachet(chat_model_dir: Path) -> Iterator[LiveServer]:
    """A started server on the bundled chat model, with `key` and `model` set on it."""
    env = {
        "CACHET_MODEL": str(chat_model_dir),
        # NOTE: this server is the backend of many requests in a row; the API's default limits
        # (60 requests a minute) are not what these tests are about.
        "CACHET_API_REQUESTS_PER_MINUTE": "100000",
        "CACHET_API_TOKENS_PER_MINUTE": "100000000",
    }
    options = {"torch_threads": 1, "kv_cache_mb": 256}
    with LiveServer(models_dir=chat_model_dir.parent, env=env, **options) as live:
        live.key = live.shell(API_KEY_SETUP).strip().splitlines()[-1]
        live.model = str(chat_model_dir).rstrip("/")
        live.start()
        yield live


def backend_for(live: LiveServer, name: str = "upstream", **fields) -> InferenceBackend:
    """An (unsaved) backend row for the live server; `fields` override."""
    values = {
        "name": name,
        "base_url": f"{live.url}/v1",
        "api_key": live.key,
        "model": live.model,
    }
    return InferenceBackend(**(values | fields))


def unreachable_url() -> str:
    """An address where nothing listens (a stopped replica)."""
    return f"http://127.0.0.1:{free_port()}/v1"


def remote_metric(live: LiveServer, sample: str) -> float:
    """One sample of the live server's /metrics, e.g. 'cachet_engine_requests_total{...}'."""
    text = live.metrics_text()
    match = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0
