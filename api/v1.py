"""The `/v1` API: OpenAI-compatible endpoints, documents and search, behind API keys.

django-ninja, not Django REST framework: the streaming endpoints need async views (the engine
streams into the event loop) and ninja's are native; its pydantic request models give OpenAI-style
validation errors and an OpenAPI 3 schema for free, served with a bundled Swagger UI (no CDN).
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer

from api import collections, documents, keys, openai, rate_limits
from api.errors import ApiError, error_response, handle_api_error


class ApiKeyAuth(HttpBearer):
    """`Authorization: Bearer <key>`; counts the request against the key's per-minute limit."""

    async def authenticate(self, request: HttpRequest, token: str):
        try:
            api_key = await keys.aauthenticate(f"Bearer {token}")
        except keys.ApiKeyError as error:
            raise ApiError(401, error.message, code="invalid_api_key") from None
        try:
            await rate_limits.acheck_request(api_key)
        except rate_limits.RateLimited as limited:
            raise ApiError(
                429,
                limited.message,
                code="rate_limit_exceeded",
                headers={"Retry-After": str(limited.retry_after_s)},
            ) from None
        await keys.arecord_usage(api_key)  # one request; tokens are added when answered
        return api_key


api = NinjaAPI(
    title="Cachet API",
    version="1",
    description="OpenAI-compatible chat, completions and embeddings; documents and search. "
    "Authenticate with `Authorization: Bearer <API key>` (keys are created in the admin).",
    auth=ApiKeyAuth(),
    urls_namespace="api-v1",
    docs_url="/docs",
)
api.add_exception_handler(ApiError, handle_api_error)


@api.exception_handler(AuthenticationError)
def missing_key(request: HttpRequest, error: AuthenticationError) -> JsonResponse:
    return error_response(
        401,
        "You didn't provide an API key. Send it as `Authorization: Bearer <key>`.",
        code="missing_api_key",
    )


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, error: HttpError) -> JsonResponse:
    """Ninja's own refusals (a body that is not JSON, ...) in OpenAI's error shape too."""
    return error_response(error.status_code, error.message)


@api.exception_handler(ValidationError)
def invalid_request(request: HttpRequest, error: ValidationError) -> JsonResponse:
    first = error.errors[0] if error.errors else {}
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "payload")]
    param = ".".join(location) or None
    message = first.get("msg", "Invalid request.")
    more = f" (and {len(error.errors) - 1} more problems)" if len(error.errors) > 1 else ""
    return error_response(400, f"{param + ': ' if param else ''}{message}{more}", param=param)


api.add_router("/", openai.router)
api.add_router("/", documents.router)
api.add_router("/", collections.router)
