"""What the chat UI's upload panel offers staff: collections to fill, readers to share them with.

A first run has no collection: the panel then offers "General" to create, instead of an empty
list, so the first document needs no trip to the admin. Readers are chosen from the users and
groups listed here; staff read every collection anyway, so only the others are offered. Anyone
but staff gets no names at all.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.utils.translation import gettext_lazy

from retrieval.models import Collection

# The name a first run offers for the first collection (the UI shows it translated).
FIRST_COLLECTION_NAME = gettext_lazy("General")
# The most users offered as readers; more are shared in the admin.
MAX_READERS_OFFERED = 500


def _possible_readers() -> list[dict]:
    users = (
        get_user_model()
        .objects.filter(is_active=True, is_staff=False)
        .order_by("username")[:MAX_READERS_OFFERED]
    )
    return [{"id": user.pk, "username": user.get_username()} for user in users]


def upload_options(user: AbstractBaseUser | AnonymousUser) -> dict:
    """The `upload` part of the chat UI's options: empty of names for anyone but staff."""
    if not user.is_staff:
        return {"allowed": False, "collections": [], "max_upload_mb": settings.CACHET_MAX_UPLOAD_MB}
    collections = [{"id": c.pk, "name": c.name} for c in Collection.objects.order_by("name")]
    return {
        "allowed": True,
        "collections": collections,
        "max_upload_mb": settings.CACHET_MAX_UPLOAD_MB,
        "first_collection_name": "" if collections else str(FIRST_COLLECTION_NAME),
        "readers": _possible_readers(),
        "reader_groups": [{"id": g.pk, "name": g.name} for g in Group.objects.order_by("name")],
    }
