"""retrieval.progress: progress is saved on the row and sent to the document's channel group."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from retrieval.models import Collection, Document
from retrieval.progress import group_name, report
from tests.documents import add_document

pytestmark = pytest.mark.django_db


@pytest.mark.integration  # also on the Redis channel layer
def test_a_report_is_saved_and_reaches_the_document_group(settings, tmp_path) -> None:
    settings.MEDIA_ROOT = tmp_path
    document = add_document(Collection.objects.create(name="c"), "a.txt", "text")
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group_name(document.pk), channel)
    report(document, Document.Status.PROCESSING, 40)
    message = async_to_sync(layer.receive)(channel)
    assert message == {
        "type": "document.progress",
        "document_id": document.pk,
        "status": "processing",
        "progress": 40,
        "error": "",
        "error_reason": {},
    }
    document.refresh_from_db()
    assert (document.status, document.progress) == ("processing", 40)
    async_to_sync(layer.group_discard)(group_name(document.pk), channel)


def test_progress_is_clamped_to_zero_to_one_hundred(settings, tmp_path) -> None:
    settings.MEDIA_ROOT = tmp_path
    document = add_document(Collection.objects.create(name="c"), "a.txt", "text")
    report(document, Document.Status.PROCESSING, 140)
    assert Document.objects.get(pk=document.pk).progress == 100
    report(document, Document.Status.FAILED, -5, "bad file")
    document.refresh_from_db()
    assert (document.progress, document.error) == (0, "bad file")


def test_a_broken_channel_layer_never_fails_the_report(settings, tmp_path) -> None:
    settings.MEDIA_ROOT = tmp_path
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]},  # nothing listens on port 1
        }
    }
    document = add_document(Collection.objects.create(name="c"), "a.txt", "text")
    report(document, Document.Status.READY, 100)
    assert Document.objects.get(pk=document.pk).status == "ready"
