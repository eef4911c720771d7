"""The chat UI's staff-only JSON endpoints share one guard: logged in (401), then staff (403)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext as _

from chat.views import error_response, login_required_json

View = Callable[..., HttpResponse]


def staff_required_json(view: View) -> View:
    """Refuse anyone but active staff with a JSON error, before the view reads anything."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            return error_response(403, "forbidden", _("only staff may manage documents"))
        return view(request, *args, **kwargs)

    return login_required_json(wrapper)
