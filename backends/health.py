"""Health of remote backends: an active check (`GET <base_url>/models`) and the recorded state.

The state lives on the row, so every server process sees what any of them last saw: a replica
that failed a request is marked down and skipped by all of them for CACHET_BACKEND_RETRY_S, then
tried again; a request or check that succeeds marks it up. The admin's "Check health" action and
`manage.py check_backends` run the active check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
from channels.db import database_sync_to_async
from django.utils import timezone

from backends.client import CONNECT_TIMEOUT_S, auth_headers
from backends.models import InferenceBackend

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 10.0
MAX_DETAIL_CHARS = 500
MAX_MODELS_NAMED = 5


@dataclass(frozen=True, slots=True)
class HealthResult:
    health: str  # InferenceBackend.Health
    detail: str

    @property
    def is_up(self) -> bool:
        return self.health == InferenceBackend.Health.UP


def check_health(backend: InferenceBackend, *, timeout_s: float = CHECK_TIMEOUT_S) -> HealthResult:
    """Ask the endpoint for its models: up when it answers and serves `backend.model`."""
    down = InferenceBackend.Health.DOWN
    timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
    try:
        response = httpx.get(backend.models_url, headers=auth_headers(backend), timeout=timeout)
    except httpx.HTTPError as error:
        return HealthResult(down, f"unreachable: {type(error).__name__}: {error}")
    if response.status_code != 200:
        return HealthResult(down, f"GET /models answered HTTP {response.status_code}")
    try:
        served = [item["id"] for item in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return HealthResult(down, "GET /models did not answer an OpenAI model list")
    if backend.model not in served:
        named = ", ".join(served[:MAX_MODELS_NAMED]) or "none"
        return HealthResult(down, f"does not serve {backend.model!r} (serves: {named})")
    return HealthResult(InferenceBackend.Health.UP, f"serves {backend.model!r}")


def record_health(backend: InferenceBackend, result: HealthResult) -> None:
    """Save `result` on the row (and on `backend`); a change of state is logged."""
    detail = result.detail[:MAX_DETAIL_CHARS]
    if backend.health != result.health:
        log = logger.info if result.is_up else logger.warning
        log("inference backend %s is %s: %s", backend.name, result.health, detail)
    backend.health, backend.health_detail = result.health, detail
    backend.health_checked_at = timezone.now()
    InferenceBackend.objects.filter(pk=backend.pk).update(
        health=backend.health,
        health_detail=backend.health_detail,
        health_checked_at=backend.health_checked_at,
    )


def check_and_record(backend: InferenceBackend) -> HealthResult:
    result = check_health(backend)
    record_health(backend, result)
    return result


@database_sync_to_async
def amark_down(backend: InferenceBackend, detail: str) -> None:
    record_health(backend, HealthResult(InferenceBackend.Health.DOWN, detail))


@database_sync_to_async
def amark_up(backend: InferenceBackend) -> None:
    """Record that a request got through; written only when the state changes."""
    if backend.health != InferenceBackend.Health.UP:
        record_health(backend, HealthResult(InferenceBackend.Health.UP, "a request succeeded"))
