"""Creating a collection from the chat UI's upload panel (staff), with its readers.

What the panel offers (the collections, the possible readers) is `chat.upload_options`.
"""

from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods

from chat.staff import staff_required_json
from chat.views import bad_json, error_response, json_object
from retrieval.models import Collection


class CollectionForm(forms.ModelForm):
    readers = forms.ModelMultipleChoiceField(
        queryset=get_user_model().objects.filter(is_active=True), required=False
    )
    reader_groups = forms.ModelMultipleChoiceField(queryset=Group.objects.all(), required=False)

    class Meta:
        model = Collection
        fields = ("name", "description", "readers", "reader_groups")


@require_http_methods(["POST"])
@staff_required_json
def collection_create(request: HttpRequest) -> JsonResponse:
    """Body `{name, description?, readers?: [user id], reader_groups?: [group id]}`."""
    body = json_object(request)
    if body is None:
        return bad_json()
    name = body.get("name")
    body["name"] = " ".join(name.split()) if isinstance(name, str) else name
    form = CollectionForm(body)
    if not form.is_valid():
        errors = form.errors.get_json_data()
        messages = [e["message"] for field_errors in errors.values() for e in field_errors]
        return error_response(400, "invalid", " ".join(messages))
    try:
        with transaction.atomic():
            collection = form.save()
    except IntegrityError:  # a collection of that name made meanwhile
        message = _("A collection named %(name)s exists already.") % {"name": body["name"]}
        return error_response(400, "invalid", message)
    return JsonResponse({"collection": {"id": collection.pk, "name": collection.name}}, status=201)
