"""WebSocket URL routes: the chat, and live ingestion progress."""

from django.urls import path

from chat.consumers import ChatConsumer
from retrieval.consumers import DocumentProgressConsumer

websocket_urlpatterns: list = [path("ws/chat/", ChatConsumer.as_asgi())]

# Live ingestion progress for the admin (staff only; see retrieval/consumers.py).
websocket_urlpatterns.append(
    path("ws/documents/<int:document_id>/progress/", DocumentProgressConsumer.as_asgi())
)
