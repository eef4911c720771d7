"""The chat WebSocket, `/ws/chat/`: the JSON protocol of docs/chat-protocol.md over `run_turn`.

One turn runs at a time per socket, as a task, so `stop` frames are read while it streams. Every
bad frame gets an `error` frame and the socket stays open. `stop` and a disconnect abort the
engine request at once; the partial answer is saved as "stopped". Errors a user can meet are in
the page's language (`language_of`); protocol errors of a broken client stay English.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _

from chat.answer import TurnControl
from chat.errors import ChatError
from chat.events import SourcesFound, TokenDelta, TurnDone, TurnEvent, TurnStarted
from chat.store import check_content
from chat.turn import TurnRequest, run_turn
from chatsite.languages import language_of

logger = logging.getLogger(__name__)

# NOTE: 4401 mirrors HTTP 401 for clients that see the close code.
CLOSE_UNAUTHENTICATED = 4401
MAX_COLLECTIONS = 100
MAX_MODEL_NAME_CHARS = 300
# How long a disconnect waits for the stopped turn to save its partial answer.
DISCONNECT_SAVE_TIMEOUT_S = 10.0


def frame_size_limit() -> int:
    # NOTE: room for the content escaped as JSON (up to 6 bytes a character) plus the fields.
    return settings.CACHET_MAX_MESSAGE_CHARS * 6 + 4096


def _conversation_json(conversation) -> dict:
    return {"id": conversation.pk, "title": conversation.title}


def _optional_int(frame: dict, name: str, *, minimum: int = 0, maximum: int = 2**63 - 1):
    value = frame.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ChatError("invalid", f"{name} must be an integer in [{minimum}, {maximum}] or null")
    return value


def _required_int(frame: dict, name: str) -> int:
    value = _optional_int(frame, name, minimum=1)
    if value is None:
        raise ChatError("invalid", f"{name} is required")
    return value


def _model_name(frame: dict) -> str | None:
    value = frame.get("model")
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_MODEL_NAME_CHARS:
        raise ChatError("invalid", f"model must be a model name (1-{MAX_MODEL_NAME_CHARS} chars)")
    return value


def _collection_ids(frame: dict) -> list[int] | None:
    value = frame.get("collections")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_COLLECTIONS:
        raise ChatError("invalid", f"collections must be a list of at most {MAX_COLLECTIONS} ids")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise ChatError("invalid", "collections must be a list of integer ids")
    return list(dict.fromkeys(value))


class ChatConsumer(AsyncJsonWebsocketConsumer):
    # NOTE: the chat needs no channel layer (the engine streams in this process, and nothing is
    # sent to a chat socket through groups). An alias that names no layer keeps it off Redis,
    # so a Redis outage cannot close chat sockets.
    channel_layer_alias = "chat-uses-no-channel-layer"
    turn_task: asyncio.Task | None = None
    control: TurnControl | None = None
    language: str = settings.LANGUAGE_CODE

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.language = language_of(self.scope)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        task = self.turn_task
        if task is None or task.done():
            return
        self.control.stop()
        # NOTE: the turn saves the partial answer as it ends; give it a moment to do so.
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), DISCONNECT_SAVE_TIMEOUT_S)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        with translation.override(self.language):
            try:
                frame = self._parse(text_data, bytes_data)
                await self._dispatch(frame)
            except ChatError as error:
                await self.send_error(error.code, error.message)

    def _parse(self, text_data: str | None, bytes_data: bytes | None) -> dict:
        if text_data is None:
            raise ChatError("bad_frame", "binary frames are not supported; send JSON text")
        if len(text_data) > frame_size_limit():
            limit = settings.CACHET_MAX_MESSAGE_CHARS
            raise ChatError("too_long", f"the frame is too large; messages hold {limit} chars")
        try:
            frame = json.loads(text_data)
        except (ValueError, RecursionError):
            raise ChatError("bad_json", "frames must be JSON objects") from None
        if not isinstance(frame, dict):
            raise ChatError("bad_json", "frames must be JSON objects")
        return frame

    async def _dispatch(self, frame: dict) -> None:
        kind = frame.get("type")
        if kind == "message":
            request = TurnRequest(
                user=self.scope["user"],
                content=check_content(frame.get("content")),
                conversation_id=_optional_int(frame, "conversation", minimum=1),
                collection_ids=_collection_ids(frame),
                profile_id=_optional_int(frame, "profile", minimum=1),
                seed=_optional_int(frame, "seed"),
                model=_model_name(frame),
            )
            self._start(request)
        elif kind == "regenerate":
            request = TurnRequest(
                user=self.scope["user"],
                conversation_id=_required_int(frame, "conversation"),
                seed=_optional_int(frame, "seed"),
                regenerate=True,
                model=_model_name(frame),
            )
            self._start(request)
        elif kind == "stop":
            if self.control is not None:
                self.control.stop()
        elif kind == "ping":
            await self.send_json({"type": "pong"})
        else:
            shown = kind if isinstance(kind, str) else json.dumps(kind)
            raise ChatError("unknown_type", f"unknown frame type {shown[:40]!r}")

    def _start(self, request: TurnRequest) -> None:
        if self.turn_task is not None and not self.turn_task.done():
            raise ChatError("busy", _("an answer is still running; stop it or wait for it"))
        self.control = TurnControl()
        self.turn_task = asyncio.create_task(self._run_turn(request, self.control))

    async def _run_turn(self, request: TurnRequest, control: TurnControl) -> None:
        conversation_id = request.conversation_id
        try:
            with translation.override(self.language):
                async with contextlib.aclosing(run_turn(request, control)) as events:
                    async for event in events:
                        if isinstance(event, TurnStarted):
                            conversation_id = event.conversation.pk
                        await self._send_event(event)
        except ChatError as error:
            await self.send_error(error.code, error.message, conversation_id)
        except Exception:
            logger.exception("chat turn failed")
            with translation.override(self.language):
                message = _("the answer failed on the server; try again")
            await self.send_error("engine_error", message, conversation_id)

    async def _send_event(self, event: TurnEvent) -> None:
        if isinstance(event, TokenDelta):
            await self.send_json({"type": "token", "text": event.text})
        elif isinstance(event, SourcesFound):
            await self.send_json({"type": "sources", "sources": event.sources})
        elif isinstance(event, TurnStarted):
            user_message = event.user_message.as_json() if event.user_message else None
            await self.send_json(
                {
                    "type": "start",
                    "conversation": _conversation_json(event.conversation),
                    "user_message": user_message,
                    "regenerate": event.user_message is None,
                }
            )
        elif isinstance(event, TurnDone):
            await self.send_json(
                {
                    "type": "done",
                    "message": event.message.as_json(),
                    "conversation": _conversation_json(event.conversation),
                }
            )

    async def send_error(self, code: str, message: str, conversation_id: int | None = None):
        await self.send_json(
            {"type": "error", "code": code, "message": message, "conversation": conversation_id}
        )

    async def send_json(self, content, close: bool = False) -> None:
        # NOTE: a client gone mid-turn must not stop the turn from saving its answer.
        try:
            await super().send_json(content, close=close)
        except Exception as error:  # the transport's own error types differ by server
            logger.debug("dropped a frame for a closed socket: %s", error)
