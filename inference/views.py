"""`GET /metrics`: the engine's and the backends' Prometheus series, for staff or a bearer token."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from backends import metrics as backend_metrics
from inference.runtime import EngineUnavailable, get_engine


def is_authorised_for_metrics(request: HttpRequest) -> bool:
    if request.user.is_authenticated and request.user.is_staff:
        return True
    token = settings.CACHET_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if not token or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not is_authorised_for_metrics(request):
        response = HttpResponse("metrics need a staff login or a bearer token\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    try:
        engine = get_engine()
    except EngineUnavailable as error:
        return HttpResponse(f"{error}\n", status=503, content_type="text/plain")
    # NOTE: routing and remote-backend series (backends.metrics) are per process, as the engine's.
    body = generate_latest(engine.metrics.registry) + generate_latest(backend_metrics.REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
