"""WebSocket URL routes (the chat consumer arrives with the chat issue)."""

from django.urls import path

from retrieval.consumers import DocumentProgressConsumer

websocket_urlpatterns: list = []

# Live ingestion progress for the admin (staff only; see retrieval/consumers.py).
websocket_urlpatterns.append(
    path("ws/documents/<int:document_id>/progress/", DocumentProgressConsumer.as_asgi())
)
