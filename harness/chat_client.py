"""The chat protocol from the client's side: send a `message` frame, read until `done` or `error`.

`chat_exchange` is the one reader of a turn's frames (`start`, `sources`, `token`, `done`,
`error`); it never raises for what the server did: an error frame, a closed socket or a timeout
end up in the `ChatReply`. `ChatClient` adds who to be (session, profile, collections) and fills
a `TurnResult`, the record the chat benchmark and the fault tests keep per turn.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from harness.chat_socket import ChatSocket, open_chat


@dataclass(slots=True)
class ChatReply:
    """What one `message` or `regenerate` frame got back, and when."""

    text: str = ""  # the `token` frames, concatenated
    token_frames: int = 0
    num_sources: int = 0
    conversation: int | None = None
    message: dict | None = None  # the saved answer, from `done`
    error: dict | None = None  # an `error` frame, a closed socket or a timeout
    ttft_s: float | None = None  # frame sent -> first token frame
    total_s: float | None = None  # frame sent -> done

    @property
    def saved_text(self) -> str | None:
        return None if self.message is None else self.message["content"]

    @property
    def stats(self) -> dict:
        return (self.message or {}).get("stats") or {}


async def chat_exchange(sock: ChatSocket, frame: dict, timeout_s: float) -> ChatReply:
    """Send `frame` and read until `done` or `error` (or the socket closes, or `timeout_s`)."""
    reply = ChatReply(conversation=frame.get("conversation"))
    deadline = asyncio.get_running_loop().time() + timeout_s
    sent = time.perf_counter()
    sock.send_json(frame)
    parts: list[str] = []
    while True:
        item = await sock.next_frame(deadline, timeout_s)
        kind = item.get("type")
        if kind == "token":
            if reply.ttft_s is None:
                reply.ttft_s = time.perf_counter() - sent
            parts.append(item["text"])
            reply.token_frames += 1
        elif kind == "start":
            reply.conversation = item["conversation"]["id"]
        elif kind == "sources":
            reply.num_sources = len(item["sources"])
        elif kind == "done":
            reply.total_s = time.perf_counter() - sent
            reply.message = item["message"]
            break
        elif kind == "error":
            reply.error = {"code": item.get("code"), "message": item.get("message")}
            break
    reply.text = "".join(parts)
    return reply


@dataclass(slots=True)
class TurnResult:
    """One turn of a chat, as the chat benchmark reports it."""

    chat: int  # 0-based; -1 for the warm-up
    turn: int  # 1-based
    ttft_s: float | None = None  # client side: message sent -> first token frame
    total_s: float | None = None  # client side: message sent -> done
    token_frames: int = 0
    num_sources: int = 0
    conversation: int | None = None
    stats: dict | None = None
    finish_reason: str | None = None
    answer: str = ""
    error: dict | None = None  # {"code", "message"}


@dataclass(frozen=True, slots=True)
class ChatClient:
    """How to reach the server and who to be: the chat socket's port, session and profile."""

    port: int
    cookie: str  # "sessionid=..."
    profile_id: int
    collection_ids: list[int]
    turn_timeout_s: float

    async def connect(self) -> ChatSocket:
        return await open_chat(self.port, self.cookie)

    async def turn(self, sock: ChatSocket, result: TurnResult, content: str, seed: int) -> None:
        """Send one message in `result`'s conversation (a new one if None), filling `result` in."""
        frame: dict = {
            "type": "message",
            "conversation": result.conversation,
            "content": content,
            "seed": seed,
        }
        if result.conversation is None:
            # NOTE: passed explicitly, so a run changes no defaults of the database.
            frame |= {"profile": self.profile_id, "collections": self.collection_ids}
        reply = await chat_exchange(sock, frame, self.turn_timeout_s)
        result.ttft_s, result.total_s = reply.ttft_s, reply.total_s
        result.token_frames, result.num_sources = reply.token_frames, reply.num_sources
        result.conversation = reply.conversation
        result.error = reply.error
        if reply.message is not None:
            result.stats = reply.message["stats"]
            result.finish_reason = reply.message["finish_reason"]
            result.answer = reply.message["content"]
