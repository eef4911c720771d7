"""The chat's WebSocket route (combined with the other apps' in chatsite.websockets)."""

from django.urls import path

from chat.consumers import ChatConsumer

websocket_urlpatterns = [path("ws/chat/", ChatConsumer.as_asgi())]
