"""`GET /healthz`: one entry per component, and "ok" only when every required one works."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from backends.models import InferenceBackend
from inference.model_files import resolve_chat_model, resolve_embedding_model
from inference.runtime import engine_status, get_engine

logger = logging.getLogger(__name__)

CHANNEL_PROBE_TIMEOUT_S = 2.0


def check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return f"{connection.vendor} reachable"


def check_channel_layer() -> str:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer configured")

    async def round_trip() -> None:
        import asyncio

        channel = await layer.new_channel("healthz.")
        token = uuid.uuid4().hex
        await layer.send(channel, {"type": "healthz.probe", "token": token})
        message = await asyncio.wait_for(layer.receive(channel), CHANNEL_PROBE_TIMEOUT_S)
        if message.get("token") != token:
            raise RuntimeError("round trip returned a different message")

    async_to_sync(round_trip)()
    return f"{type(layer).__name__} round trip ok"


def check_broker() -> str | None:
    """None when no broker is configured (tasks then run in-process)."""
    if not settings.REDIS_URL:
        return None
    from chatsite.celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)
    return "redis broker reachable"


def check_chat_model() -> str:
    resolved = resolve_chat_model(
        settings.CACHET_MODEL,
        settings.MODELS_DIR,
        may_prepare=False,
        model_cache=settings.CACHET_MODEL_CACHE,
    )
    return f"{resolved.source} ready at {resolved.directory}"


class EngineLoading(Exception):
    """Expected for a while after start: reported as "loading", not logged as a failure."""


def check_engine() -> str:
    status = engine_status()
    if status["status"] == "loading" and not status["error"]:
        raise EngineLoading("the model is loading")
    if status["status"] != "ready":
        detail = status["error"] or "the engine is not running in this process"
        raise RuntimeError(f"{status['status']}: {detail}")
    snapshot = get_engine().metrics.snapshot()
    return (
        f"{status['config']!r} ready; {snapshot['num_running']} running, "
        f"{snapshot['num_waiting']} waiting, KV {snapshot['kv_usage']:.0%} used"
    )


def check_embedding_model() -> str:
    resolved = resolve_embedding_model(settings.CACHET_EMBEDDING_MODEL, may_prepare=False)
    return f"{resolved.source} ready at {resolved.directory}"


def check_search_index() -> str:
    """The vector store of this process: which, its size and model, or a rebuild's progress.

    NOTE: never loads the retriever (that is the start-up check's work); a rebuild is reported,
    not failed: searches answer meanwhile, by BM25 alone.
    """
    from retrieval.consistency import rebuild_progress
    from retrieval.search import current_retriever

    progress = rebuild_progress()
    if progress is not None:
        return f"rebuilding, searches use BM25 alone until done: {progress.describe()}"
    retriever = current_retriever()
    if retriever is None:
        return f"not loaded yet in this process ({settings.CACHET_EMBEDDING_MODEL})"
    vectors = retriever.vectors
    return f"{len(vectors)} vectors of {retriever.embedder.model_id} in {vectors.describe()}" + (
        f" ({vectors.reason})" if vectors.reason else ""
    )


def check_lexical_store() -> str:
    """Where BM25 runs (retrieval.lexical_store): bm25s in this process, or PostgreSQL."""
    from retrieval.lexical_store import lexical_store_name
    from retrieval.search import current_retriever

    retriever = current_retriever()
    if retriever is None:
        return f"{lexical_store_name()}, not loaded yet in this process"
    return retriever.lexical.describe()


def check_remote_backends() -> str | None:
    """The last recorded health of each enabled remote backend; None when none is enabled.

    NOTE: reported, never failing: a remote backend that is down does not make this server
    unhealthy (its turns fall back to the local engine or fail on their own), and a load
    balancer must not take a working server out over it. Active checks are the admin action and
    `manage.py check_backends`; this reads what they and live traffic recorded.
    """
    backends = list(InferenceBackend.objects.filter(is_enabled=True).order_by("name"))
    if not backends:
        return None
    return "; ".join(
        f"{backend.name} ({backend.model}): {backend.health}"
        + (f" ({backend.health_detail})" if backend.health_detail else "")
        for backend in backends
    )


CHECKS: dict[str, Callable[[], str | None]] = {
    "database": check_database,
    "channel_layer": check_channel_layer,
    "broker": check_broker,
    "chat_model": check_chat_model,
    "engine": check_engine,
    "embedding_model": check_embedding_model,
    "search_index": check_search_index,
    "lexical_store": check_lexical_store,
    "remote_backends": check_remote_backends,
}
# What a check that returns None (an optional component) reports.
NOT_CONFIGURED = {
    "broker": "tasks run in-process (REDIS_URL unset)",
    "remote_backends": "no remote backend is enabled",
}


def run_checks() -> dict:
    components: dict[str, dict] = {}
    for name, check in CHECKS.items():
        started = time.perf_counter()
        try:
            detail = check()
        except EngineLoading as loading:
            state = {"state": "loading", "detail": str(loading)}
        except Exception as error:  # a health check reports every failure, whatever its kind
            logger.warning("health check %s failed: %s", name, error)
            state = {"state": "error", "detail": f"{type(error).__name__}: {error}"}
        else:
            state = (
                {"state": "not_configured", "detail": NOT_CONFIGURED[name]}
                if detail is None
                else {"state": "ok", "detail": detail}
            )
        state["seconds"] = round(time.perf_counter() - started, 4)
        components[name] = state
    states = {c["state"] for c in components.values()}
    if states <= {"ok", "not_configured"}:
        status = "ok"
    else:
        status = "loading" if states <= {"ok", "not_configured", "loading"} else "error"
    return {"status": status, "components": components}


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    report = run_checks()
    response = JsonResponse(report, status=200 if report["status"] == "ok" else 503)
    if report["status"] == "loading":
        # NOTE: a 503 while the model loads is expected (load balancers poll it); marking it
        # logged keeps Django from writing an ERROR line per poll.
        response._has_been_logged = True
    return response
