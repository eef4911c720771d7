"""Retrieval's WebSocket route: live ingestion progress for the admin (staff only)."""

from django.urls import path

from retrieval.consumers import DocumentProgressConsumer

# NOTE: django-stubs types path() for views only; Channels routes ASGI apps with it too.
websocket_urlpatterns = [
    path("ws/documents/<int:document_id>/progress/", DocumentProgressConsumer.as_asgi()),  # type: ignore[arg-type]
]
