"""`GET /metrics`: the engine's Prometheus series, for staff or a bearer token."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

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
    return HttpResponse(generate_latest(engine.metrics.registry), content_type=CONTENT_TYPE_LATEST)
