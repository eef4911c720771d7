"""WebSocket URL routes (the chat consumer arrives with the chat issue)."""

websocket_urlpatterns: list = []
