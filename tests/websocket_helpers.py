"""Sockets through the production WebSocket stack (origin check, session auth, routes)."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from chatsite.websockets import websocket_application

APPLICATION = websocket_application()


@database_sync_to_async
def make_user(name: str, *, is_staff: bool = False) -> User:
    return User.objects.create_user(name, password="pw-" + name, is_staff=is_staff)


@database_sync_to_async
def session_cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


async def communicator(
    path: str,
    user: User | None,
    *,
    origin: bytes = b"http://localhost",
    cookies: dict[str, str] | None = None,
    accept_language: str | None = None,
) -> WebsocketCommunicator:
    """A socket to `path`, logged in as `user` if given, with the browser's other `cookies` and
    Accept-Language if given."""
    headers = [(b"origin", origin), (b"host", b"localhost")]
    jar = dict(cookies or {})
    if user is not None:
        jar[settings.SESSION_COOKIE_NAME] = await session_cookie(user)
    if jar:
        headers.append((b"cookie", "; ".join(f"{k}={v}" for k, v in jar.items()).encode()))
    if accept_language is not None:
        headers.append((b"accept-language", accept_language.encode()))
    return WebsocketCommunicator(APPLICATION, path, headers)
