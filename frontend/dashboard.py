"""The staff performance dashboard: its page, its JSON and the last benchmark run's chart.

Staff only: another logged-in user gets 403 (the page and the data alike), an anonymous one the
log-in page (the page) or 401 (the data). The numbers are this server process's (see
inference/metrics_history.py for why), read from the same registries as `/metrics`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext_lazy as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from frontend.views import catalog_url
from inference import metrics_history, runtime
from inference.dashboard_series import backend_series, model_series, totals
from inference.metrics_history import WINDOW_S

logger = logging.getLogger(__name__)

BENCHMARK_TABLE = Path(settings.BASE_DIR) / "docs" / "benchmarks.json"
# The page's charts in order: the data each draws (dashboard/main.js) and its caption.
CHARTS = (
    ("hit_rate", _("Prefix-cache hit rate (prompt tokens, per minute)")),
    ("ttft", _("Time to first token (s), percentiles per minute")),
    ("itl", _("Inter-token latency (s), percentiles per minute")),
    ("tokens_per_s", _("Generated tokens per second")),
    ("requests", _("Requests running and waiting")),
    ("kv_usage", _("KV cache in use")),
    ("backends", _("Chat turns per minute, by backend")),
)


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("the dashboard is for staff")
    context = {
        "catalog_url": catalog_url(translation.get_language()),
        "config": {
            "data_url": reverse("frontend:dashboard-data"),
            "chart_url": reverse("frontend:benchmark-chart"),
        },
        "charts": CHARTS,
        "pid": os.getpid(),
        "sample_interval_s": settings.CACHET_DASHBOARD_SAMPLE_S,
    }
    return render(request, "frontend/dashboard.html", context)


@require_GET
@never_cache
def dashboard_data(request: HttpRequest) -> JsonResponse:
    if not request.user.is_authenticated:
        return _error(401, "unauthenticated", "log in first")
    if not request.user.is_staff:
        return _error(403, "forbidden", "the dashboard is for staff")
    history = metrics_history.process_history()
    engine_now, backends_now = metrics_history.read_now()
    models = history.models() if history is not None else {}
    current = engine_now.model if engine_now is not None else None
    full = history.max_readings if history is not None else 0
    backend_readings = history.backends() if history is not None else [backends_now]
    return JsonResponse(
        {
            "process": {
                "pid": os.getpid(),
                "is_sampling": history is not None,
                "sample_interval_s": history.interval_s if history is not None else None,
                "window_s": WINDOW_S,
            },
            "engine": runtime.engine_status(),
            "now": None
            if engine_now is None
            else {
                "time": engine_now.time,
                "model": engine_now.model,
                "num_running": engine_now.num_running,
                "num_waiting": engine_now.num_waiting,
                "kv_usage": engine_now.kv_usage,
                **totals(engine_now),
            },
            "models": [
                model_series(
                    name, readings, is_current=name == current, is_full=len(readings) >= full
                )
                for name, readings in reversed(models.items())
                if readings
            ],
            "backends": backend_series(backend_readings),
            "benchmark": last_benchmark(),
        }
    )


def last_benchmark() -> dict | None:
    """The optimization table of the last `bench.engine --table` run (None: no run recorded)."""
    try:
        table: dict = json.loads(BENCHMARK_TABLE.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("the benchmark table %s is unreadable: %s", BENCHMARK_TABLE, error)
        return None
    return table


@require_GET
def benchmark_chart(request: HttpRequest) -> FileResponse:
    if not (request.user.is_authenticated and request.user.is_staff):
        raise Http404("no such chart")
    table = last_benchmark()
    chart = (table or {}).get("chart")
    if not chart:
        raise Http404("the last benchmark run drew no chart")
    path = (BENCHMARK_TABLE.parent / chart).resolve()
    # NOTE: the name comes from a file in the repository; still, never serve outside docs/.
    if not path.is_relative_to(BENCHMARK_TABLE.parent.resolve()) or not path.is_file():
        raise Http404("the chart is missing")
    return FileResponse(path.open("rb"), content_type="image/png")
