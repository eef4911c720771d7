"""harness.chat_client: one reader of a turn's frames fills both the reply and the turn record."""

from __future__ import annotations

import asyncio

from harness import CLOSED, ChatClient, TurnResult, chat_exchange

DONE = {
    "type": "done",
    "message": {"content": "Hello there", "finish_reason": "stop", "stats": {"ttft_s": 0.1}},
}


class ScriptedSocket:
    """Stands in for `ChatSocket`: hands out the given frames, records what was sent."""

    def __init__(self, frames: list) -> None:
        self.frames: asyncio.Queue = asyncio.Queue()
        for frame in frames:
            self.frames.put_nowait(frame)
        self.sent: list[dict] = []
        self.close_info = (1000, "")

    def send_json(self, frame: dict) -> None:
        self.sent.append(frame)

    async def next_frame(self, deadline: float, timeout_s: float) -> dict:
        item = await self.frames.get()
        if item is CLOSED:
            return {"type": "error", "code": "closed", "message": "socket closed"}
        return item


def turn_frames() -> list:
    return [
        {"type": "start", "conversation": {"id": 7}},
        {"type": "sources", "sources": [{"index": 1}, {"index": 2}]},
        {"type": "token", "text": "Hello"},
        {"type": "token", "text": " there"},
        DONE,
    ]


async def test_an_exchange_collects_the_text_sources_conversation_and_timings() -> None:
    sock = ScriptedSocket(turn_frames())
    reply = await chat_exchange(sock, {"type": "message", "content": "Hi"}, timeout_s=5)
    assert reply.text == "Hello there" and reply.saved_text == "Hello there"
    assert reply.token_frames == 2 and reply.num_sources == 2 and reply.conversation == 7
    assert reply.error is None and reply.stats == {"ttft_s": 0.1}
    assert 0 <= reply.ttft_s <= reply.total_s


async def test_a_closed_socket_ends_the_exchange_with_an_error_not_an_exception() -> None:
    sock = ScriptedSocket([{"type": "token", "text": "Hel"}, CLOSED])
    reply = await chat_exchange(sock, {"type": "message", "conversation": 3}, timeout_s=5)
    assert reply.error == {"code": "closed", "message": "socket closed"}
    assert reply.text == "Hel" and reply.conversation == 3 and reply.total_s is None


async def test_a_client_turn_names_the_profile_only_for_a_new_conversation() -> None:
    client = ChatClient(port=1, cookie="sessionid=x", profile_id=5, collection_ids=[9],
                        turn_timeout_s=5)  # fmt: skip
    sock = ScriptedSocket(turn_frames() + turn_frames())
    first = TurnResult(0, 1)
    await client.turn(sock, first, "Hi", seed=1)
    second = TurnResult(0, 2, conversation=first.conversation)
    await client.turn(sock, second, "And?", seed=2)
    assert sock.sent[0] == {
        "type": "message", "conversation": None, "content": "Hi", "seed": 1,
        "profile": 5, "collections": [9],
    }  # fmt: skip
    assert "profile" not in sock.sent[1] and sock.sent[1]["conversation"] == 7
    assert first.answer == "Hello there" and first.finish_reason == "stop"
    assert first.num_sources == 2 and first.token_frames == 2 and first.error is None
