"""The language of a WebSocket's page, for the consumers that answer in it (chat, ingestion)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils import translation


def language_of(scope: Any) -> str:
    """The language LocaleMiddleware chose for the page that opened this socket: the language
    cookie (set_language), else the browser's Accept-Language, else LANGUAGE_CODE."""
    request = HttpRequest()
    request.COOKIES = scope.get("cookies", {})
    for name, value in scope.get("headers", []):
        if name == b"accept-language":
            request.META["HTTP_ACCEPT_LANGUAGE"] = value.decode("latin-1")
    return translation.get_language_from_request(request)
