"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with its status.

Clients such as the official `openai` package map the status to their exception classes
(400 BadRequestError, 401 AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError,
413, 429 RateLimitError, 503 InternalServerError) and show `message`.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "server_overloaded",
}


class ApiError(Exception):
    """An error the client gets as `status` with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    def response(self) -> JsonResponse:
        return error_response(self.status, self.message, self.code, self.param, self.headers)


def error_response(
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JsonResponse:
    body = {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "api_error"),
            "param": param,
            "code": code,
        }
    }
    response = JsonResponse(body, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def handle_api_error(request: HttpRequest, error: ApiError) -> JsonResponse:
    return error.response()


def require_staff(user, what: str) -> None:
    """403 unless the key's user is staff; `what` names what only staff may manage."""
    if not user.is_staff:
        raise ApiError(403, f"Only staff keys may manage {what}.", code="forbidden")
