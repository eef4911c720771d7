"""Pages of the browser UI: the chat, log-in and log-out, and the chat UI's translations (Django's
JavaScript catalog). A document's page is in documents.py, the retrieval test page in
retrieval_test.py."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import translation
from django.views.decorators.cache import cache_control
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.i18n import JavaScriptCatalog

from chat.models import Conversation


@login_required
@ensure_csrf_cookie
def chat(request: HttpRequest, conversation_id: int | None = None) -> HttpResponse:
    if (
        conversation_id is not None
        and not Conversation.objects.owned_by(request.user).filter(pk=conversation_id).exists()
    ):
        raise Http404("no such conversation")
    config = {
        "conversation_id": conversation_id,
        "ws_path": "/ws/chat/",
        "api_root": "/chat/api/",
        "logout_url": "/logout/",
    }
    context = {
        "config": config,
        "catalog_url": catalog_url(translation.get_language()),
        "conversation_id": conversation_id,
        "username": request.user.get_username(),
        "is_staff": request.user.is_staff,
    }
    return render(request, "frontend/chat.html", context)


login = auth_views.LoginView.as_view(
    template_name="frontend/login.html", redirect_authenticated_user=True
)
logout = auth_views.LogoutView.as_view()


@cache
def _catalog_version() -> str:
    """A digest of the compiled JavaScript translations: a new one gets a new catalog URL."""
    digest = hashlib.sha256()
    for locale_dir in settings.LOCALE_PATHS:
        for compiled in sorted(Path(locale_dir).glob("*/LC_MESSAGES/djangojs.mo")):
            digest.update(compiled.read_bytes())
    return digest.hexdigest()[:12]


def catalog_url(language: str) -> str:
    """The JavaScript catalog of `language` (one of LANGUAGES), versioned by its content."""
    url = reverse(
        "frontend:javascript-catalog", args=[translation.get_supported_language_variant(language)]
    )
    return f"{url}?v={_catalog_version()}"


class LanguageCatalog(JavaScriptCatalog):
    """Django's JavaScript catalog for the language in the URL, not the negotiated one.

    NOTE: the URL names the language and the version of the translations (`catalog_url`), so a
    browser may keep a catalog for a year and never uses a stale one, or the other language's
    after a switch.
    """

    # Only Cachet's own strings (LOCALE_PATHS, always read): not every installed app's.
    packages = ["frontend"]

    def get(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        language = kwargs.pop("language")
        if language not in dict(settings.LANGUAGES):
            raise Http404("no such language")
        with translation.override(language):
            response = super().get(request, *args, **kwargs)
        response.headers["Content-Language"] = language
        return response


javascript_catalog = cache_control(public=True, max_age=365 * 24 * 3600, immutable=True)(
    LanguageCatalog.as_view()
)
