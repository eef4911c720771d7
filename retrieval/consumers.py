"""Live ingestion progress over a WebSocket: `ws/documents/<id>/progress/`, staff only.

The consumer joins the channel group `document.<id>` that `retrieval.progress.report` sends to,
sends the document's current state on connect, then forwards every `document.progress` event,
a failure's reason in the language of the page that opened the socket (`retrieval.reasons`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from asgiref.typing import (
    ASGIReceiveCallable,
    ASGISendCallable,
    ASGISendEvent,
    WebSocketAcceptEvent,
    WebSocketCloseEvent,
)
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.utils import translation
from redis.exceptions import RedisError

from chatsite.languages import language_of
from retrieval import reasons
from retrieval.models import Document
from retrieval.progress import group_name

# NOTE: 4003 mirrors HTTP 403, so the admin's script can tell "refused" from "server gone".
CLOSE_FORBIDDEN = 4003
CLOSE_NOT_FOUND = 4004
# 4503 mirrors HTTP 503: the channel layer (Redis) is unreachable; the page then polls. (Not
# RFC 6455's 1013: daphne's autobahn only sends 1000 and 3000-4999.)
CLOSE_UNAVAILABLE = 4503

logger = logging.getLogger(__name__)


@database_sync_to_async
def _document_state(document_id: int) -> dict[str, Any] | None:
    row = (
        Document.objects.filter(pk=document_id)
        .values("status", "progress", "error", "error_reason")
        .first()
    )
    if row is None:
        return None
    return {"document_id": document_id, **row}


class DocumentProgressConsumer(AsyncJsonWebsocketConsumer):
    group: str | None = None
    language: str = settings.LANGUAGE_CODE

    async def __call__(
        self, scope: Any, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        # NOTE: `scope: Any`: Channels' scope type is private to its stubs.
        sent: list[str] = []

        async def recording_send(message: ASGISendEvent) -> None:
            sent.append(message["type"])
            await send(message)

        try:
            await super().__call__(scope, receive, recording_send)
        except (RedisError, OSError) as error:
            # NOTE: a Redis outage ends the socket with 4503 ("unavailable") and one warning,
            # not a traceback per socket; the page falls back to polling. A handshake still open
            # is accepted first: refusing it would read as HTTP 403, "forbidden".
            logger.warning("progress socket closed: the channel layer is unreachable (%s)", error)
            if "websocket.close" in sent:
                return
            with contextlib.suppress(Exception):
                if "websocket.accept" not in sent:
                    await send(
                        WebSocketAcceptEvent(type="websocket.accept", subprotocol=None, headers=[])
                    )
                await send(
                    WebSocketCloseEvent(type="websocket.close", code=CLOSE_UNAVAILABLE, reason=None)
                )

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active or not user.is_staff:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.language = language_of(self.scope)
        document_id = int(self.scope["url_route"]["kwargs"]["document_id"])
        state = await _document_state(document_id)
        if state is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = group_name(document_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.document_progress(state)

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The socket is one-way; anything a client sends is ignored."""

    async def document_progress(self, event: dict[str, Any]) -> None:
        with translation.override(self.language):
            error = reasons.display(event.get("error", ""), event.get("error_reason"))
        await self.send_json(
            {
                "type": "document.progress",
                "document_id": event["document_id"],
                "status": event["status"],
                "progress": event["progress"],
                "error": error,
            }
        )
