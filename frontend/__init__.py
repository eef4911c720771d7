"""The frontend app: the browser chat UI and its WebSocket consumer."""
