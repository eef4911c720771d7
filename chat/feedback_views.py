"""Feedback on answers (the chat UI's thumbs and note): read, set or clear one's own rating.

Only the owner of the answer's conversation may read or rate it: another user's answer, a
question, or a missing id all answer 404 alike, so ids leak nothing. CSRF applies to changes.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods

from chat.models import AnswerFeedback, Conversation, Message
from chat.views import bad_json, error_response, json_object, login_required_json


def feedback_json(feedback: AnswerFeedback | None) -> dict | None:
    return feedback.as_json() if feedback is not None else None


@require_http_methods(["GET", "PUT", "DELETE"])
@login_required_json
def message_feedback(request: HttpRequest, message_id: int) -> HttpResponse:
    """GET -> `{feedback}`; PUT `{rating: "up"|"down", note?}` -> `{feedback}`; DELETE -> 204."""
    answer = Message.objects.filter(
        pk=message_id,
        role=Message.Role.ASSISTANT,
        conversation__in=Conversation.objects.owned_by(request.user),
    ).first()
    if answer is None:
        return error_response(404, "not_found", _("answer %(id)s not found") % {"id": message_id})
    existing = AnswerFeedback.objects.filter(message=answer, user=request.user)
    if request.method == "DELETE":
        existing.delete()
        return HttpResponse(status=204)
    if request.method == "GET":
        return JsonResponse({"feedback": feedback_json(existing.first())})
    body = json_object(request)
    if body is None:
        return bad_json()
    rating, note = body.get("rating"), body.get("note", "")
    if rating not in AnswerFeedback.Rating.values:
        return error_response(400, "invalid", _('rating must be "up" or "down"'))
    if not isinstance(note, str):
        return error_response(400, "invalid", _("note must be a string"))
    note = note.strip()
    if len(note) > AnswerFeedback.NOTE_MAX_CHARS:
        message = _("the note must be at most %(max)s characters")
        return error_response(400, "invalid", message % {"max": AnswerFeedback.NOTE_MAX_CHARS})
    feedback, _created = AnswerFeedback.objects.update_or_create(
        message=answer, user=request.user, defaults={"rating": rating, "note": note}
    )
    return JsonResponse({"feedback": feedback_json(feedback)})
