"""Tests of chat/: conversations, the turn, its prompt, the WebSocket consumer, the UI endpoints."""
