"""Pages of the browser UI: the chat, a document's text by chunk, log-in and log-out."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from chat.models import Conversation
from retrieval.models import Collection, Document


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
        "conversation_id": conversation_id,
        "username": request.user.get_username(),
        "is_staff": request.user.is_staff,
    }
    return render(request, "frontend/chat.html", context)


@login_required
def document(request: HttpRequest, document_id: int) -> HttpResponse:
    readable = Collection.readable_by(request.user)
    found = (
        Document.objects.select_related("collection")
        .filter(pk=document_id, collection__in=readable)
        .first()
    )
    if found is None:
        raise Http404("no such document")
    context = {"document": found, "chunks": found.chunks.order_by("ordinal")}
    return render(request, "frontend/document.html", context)


login = auth_views.LoginView.as_view(
    template_name="frontend/login.html", redirect_authenticated_user=True
)
logout = auth_views.LogoutView.as_view()
