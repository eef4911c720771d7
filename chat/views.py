"""The browser UI's JSON endpoints (docs/chat-protocol.md): conversations, options, uploads.

Session-authenticated; CSRF applies to every change. Another user's conversation answers 404,
exactly as a missing one. Error messages are in the page's language (the UI shows them).
"""

from __future__ import annotations

import json
from functools import wraps

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.datastructures import MultiValueDict
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods

from chat.model_choices import chat_models
from chat.models import AnswerFeedback, AssistantProfile, Conversation, Message
from chat.upload_options import upload_options
from retrieval.forms import UploadForm
from retrieval.models import Collection
from retrieval.tasks import add_upload, drop_unqueued

MAX_CONVERSATIONS_LISTED = 500


def error_response(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def json_object(request: HttpRequest) -> dict | None:
    """The request's body as a JSON object (an empty body: `{}`); None when it is not one."""
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, RecursionError):  # NOTE: deep nesting exhausts the decoder's stack
        return None
    return body if isinstance(body, dict) else None


def bad_json() -> JsonResponse:
    return error_response(400, "bad_json", _("the body must be a JSON object"))


def login_required_json(view):
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated or not request.user.is_active:
            return error_response(401, "unauthenticated", _("log in first"))
        return view(request, *args, **kwargs)

    return wrapper


def _summary(conversation: Conversation) -> dict:
    return {
        "id": conversation.pk,
        "title": conversation.title or _("New chat"),
        "updated_at": conversation.updated_at.isoformat(),
    }


def _named(items) -> list[dict]:
    return [{"id": item.pk, "name": item.name} for item in items]


@require_http_methods(["GET"])
@login_required_json
def options(request: HttpRequest) -> JsonResponse:
    user = request.user
    collections = Collection.readable_by(user).order_by("name")
    default = AssistantProfile.default()
    return JsonResponse(
        {
            "user": {"username": user.get_username(), "is_staff": user.is_staff},
            "profiles": [
                {"id": p.pk, "name": p.name, "is_default": p.pk == default.pk}
                for p in AssistantProfile.objects.all()
            ],
            "collections": _named(collections),
            "max_message_chars": settings.CACHET_MAX_MESSAGE_CHARS,
            "models": chat_models(),
            "upload": upload_options(user),
        }
    )


@require_http_methods(["GET"])
@login_required_json
def conversation_list(request: HttpRequest) -> JsonResponse:
    conversations = Conversation.objects.owned_by(request.user)[:MAX_CONVERSATIONS_LISTED]
    return JsonResponse({"conversations": [_summary(c) for c in conversations]})


@require_http_methods(["GET", "PATCH", "DELETE"])
@login_required_json
def conversation_detail(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = (
        Conversation.objects.owned_by(request.user)
        .select_related("profile")
        .filter(pk=conversation_id)
        .first()
    )
    if conversation is None:
        return error_response(
            404, "not_found", _("conversation %(id)s not found") % {"id": conversation_id}
        )
    if request.method == "DELETE":
        conversation.delete()
        return HttpResponse(status=204)
    if request.method == "PATCH":
        return _rename(request, conversation)
    profile = conversation.profile
    return JsonResponse(
        {
            **_summary(conversation),
            "profile": {"id": profile.pk, "name": profile.name} if profile else None,
            "collections": _named(conversation.collections.order_by("name")),
            "messages": _messages_json(conversation, request.user),
        }
    )


def _messages_json(conversation: Conversation, user) -> list[dict]:
    """The conversation's messages, each answer with the user's feedback on it (or null)."""
    ratings = {
        feedback.message_id: feedback.as_json()
        for feedback in AnswerFeedback.objects.filter(message__conversation=conversation, user=user)
    }
    messages = Message.objects.filter(conversation=conversation)
    return [{**m.as_json(), "feedback": ratings.get(m.pk)} for m in messages]


def _rename(request: HttpRequest, conversation: Conversation) -> JsonResponse:
    body = json_object(request)
    if body is None:
        return bad_json()
    title = body.get("title")
    max_length = Conversation._meta.get_field("title").max_length
    if not isinstance(title, str) or not title.strip():
        return error_response(400, "invalid", _("title must be a non-empty string"))
    if len(title.strip()) > max_length:
        message = _("title must be at most %(max)s characters") % {"max": max_length}
        return error_response(400, "invalid", message)
    conversation.title = " ".join(title.split())
    conversation.save(update_fields=["title", "updated_at"])
    return JsonResponse(_summary(conversation))


@require_http_methods(["POST"])
@login_required_json
def document_upload(request: HttpRequest) -> JsonResponse:
    if not request.user.is_staff:
        return error_response(403, "forbidden", _("only staff may upload documents"))
    uploads = request.FILES.getlist("file")
    limit_mb = settings.CACHET_MAX_UPLOAD_MB
    for upload in uploads:
        if upload.size > limit_mb * 1024 * 1024:
            message = _("%(name)s is larger than the %(limit)s MB limit") % {
                "name": upload.name,
                "limit": limit_mb,
            }
            return error_response(413, "too_large", message)
    form = UploadForm(request.POST, MultiValueDict({"files": uploads}))
    if not form.is_valid():
        errors = form.errors.get_json_data()
        messages = [e["message"] for field_errors in errors.values() for e in field_errors]
        return error_response(400, "invalid", " ".join(messages))
    with transaction.atomic():
        documents = [
            add_upload(form.cleaned_data["collection"], upload, request.user)
            for upload in form.cleaned_data["files"]
        ]
    reason = drop_unqueued(documents)
    if reason is not None:
        return error_response(503, "queue_unavailable", reason)
    document = documents[0]
    return JsonResponse(
        {"document": {"id": document.pk, "title": document.title, "status": document.status}},
        status=201,
    )
