"""chat.consumers: the chat WebSocket protocol over the production stack and the real model."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.consumers import CLOSE_UNAUTHENTICATED
from chat.delta_sources import prompt_builder_for
from chat.models import Conversation, Message
from chat.turn import sampling_params_for
from inference.models import ModelConfig
from tests.idle_kv import wait_for_idle_kv
from tests.websocket_helpers import communicator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.real_weights]

TIMEOUT_S = 60


async def chat_socket(user):
    ws = await communicator("/ws/chat/", user)
    connected, _ = await ws.connect()
    assert connected
    return ws


async def frames_until(ws, *types: str) -> list[dict]:
    frames = []
    while True:
        frame = await ws.receive_json_from(timeout=TIMEOUT_S)
        frames.append(frame)
        if frame["type"] in types:
            return frames


async def assert_still_usable(ws) -> None:
    await ws.send_json_to({"type": "ping"})
    assert await ws.receive_json_from(timeout=TIMEOUT_S) == {"type": "pong"}


async def test_a_message_streams_start_sources_tokens_and_done_equal_to_the_non_streamed_answer(
    served_engine, quick_profile, handbook, alice
) -> None:
    await sync_to_async(handbook.readers.add)(alice)
    ws = await chat_socket(alice)
    try:
        question = "How many days of paid holiday do employees get?"
        await ws.send_json_to(
            {"type": "message", "conversation": None, "content": question, "seed": 99}
        )
        frames = await frames_until(ws, "done", "error")
    finally:
        await ws.disconnect()

    start, sources, *tokens, done = frames
    assert start["type"] == "start" and start["regenerate"] is False
    assert start["user_message"]["content"] == question
    assert sources["type"] == "sources" and sources["sources"][0]["document_title"] == "handbook.md"
    assert tokens and {t["type"] for t in tokens} == {"token"}
    assert done["type"] == "done"
    streamed = "".join(t["text"] for t in tokens)
    assert done["message"]["content"] == streamed
    assert done["conversation"] == {"id": start["conversation"]["id"], "title": question}
    stats = done["message"]["stats"]
    assert stats["prompt_tokens"] > 100 and stats["ttft_s"] > 0 and stats["tokens_per_s"] >= 0
    assert stats["model"] == "smollm2-135m-instruct"

    saved_question = await sync_to_async(Message.objects.get)(pk=start["user_message"]["id"])
    builder = prompt_builder_for(served_engine, quick_profile.system_prompt)
    prompt = builder.build([], saved_question.prompt_content, max_tokens=24)
    params = sampling_params_for(quick_profile, ModelConfig(), seed=99)
    [reference] = await asyncio.to_thread(served_engine.generate, [prompt.token_ids], params)
    assert streamed == reference.text


async def test_stop_ends_the_answer_at_once_saves_it_as_stopped_and_frees_the_kv_blocks(
    served_engine, quick_profile, alice
) -> None:
    await sync_to_async(type(quick_profile).objects.filter(pk=quick_profile.pk).update)(
        max_tokens=400
    )
    ws = await chat_socket(alice)
    try:
        await ws.send_json_to({"type": "message", "content": "Tell me a very long story."})
        await frames_until(ws, "token")
        await ws.send_json_to({"type": "stop"})
        frames = await frames_until(ws, "done", "error")
        await wait_for_idle_kv(served_engine)
        await assert_still_usable(ws)
    finally:
        await ws.disconnect()
    done = frames[-1]
    assert done["type"] == "done"
    assert done["message"]["finish_reason"] == "stopped"
    assert done["message"]["stats"]["completion_tokens"] < 400
    saved = await sync_to_async(Message.objects.get)(pk=done["message"]["id"])
    assert saved.finish_reason == "stopped" and saved.content == done["message"]["content"]


async def test_a_disconnect_mid_answer_aborts_the_request_and_keeps_the_partial_answer(
    served_engine, quick_profile, alice
) -> None:
    await sync_to_async(type(quick_profile).objects.filter(pk=quick_profile.pk).update)(
        max_tokens=400
    )
    ws = await chat_socket(alice)
    await ws.send_json_to({"type": "message", "content": "Tell me a very long story."})
    frames = await frames_until(ws, "token")
    await ws.disconnect()
    await wait_for_idle_kv(served_engine)
    conversation_id = frames[0]["conversation"]["id"]
    answer = await sync_to_async(
        Message.objects.filter(conversation_id=conversation_id, role="assistant").get
    )()
    assert answer.finish_reason == "stopped"
    assert answer.content.startswith(frames[-1]["text"])


async def test_regenerate_streams_a_new_answer_that_replaces_the_old_one(
    served_engine, quick_profile, alice
) -> None:
    ws = await chat_socket(alice)
    try:
        await ws.send_json_to({"type": "message", "content": "Say hi.", "seed": 1})
        first = await frames_until(ws, "done")
        conversation_id = first[0]["conversation"]["id"]
        await ws.send_json_to({"type": "regenerate", "conversation": conversation_id, "seed": 2})
        second = await frames_until(ws, "done", "error")
    finally:
        await ws.disconnect()
    assert second[0] == {
        "type": "start",
        "conversation": {"id": conversation_id, "title": "Say hi."},
        "user_message": None,
        "regenerate": True,
    }
    assert second[-1]["type"] == "done"
    answers = await sync_to_async(list)(
        Message.objects.filter(conversation_id=conversation_id, role="assistant")
    )
    assert [a.pk for a in answers] == [second[-1]["message"]["id"]]


BAD_FRAMES = [
    ("not json", "bad_json"),
    ("[1, 2]", "bad_json"),
    ('"text"', "bad_json"),
    ("{}", "unknown_type"),
    ('{"type": "launch"}', "unknown_type"),
    ('{"type": ["message"]}', "unknown_type"),
    ('{"type": "message"}', "invalid"),
    ('{"type": "message", "content": 42}', "invalid"),
    ('{"type": "message", "content": "  "}', "invalid"),
    ('{"type": "message", "content": "hi", "conversation": "1"}', "invalid"),
    ('{"type": "message", "content": "hi", "conversation": true}', "invalid"),
    ('{"type": "message", "content": "hi", "collections": "all"}', "invalid"),
    ('{"type": "message", "content": "hi", "seed": -1}', "invalid"),
    ('{"type": "regenerate"}', "invalid"),
    (json.dumps({"type": "message", "content": "x" * 8001}), "too_long"),
    ("[" * 100_000, "too_long"),
    ('{"type": "message", "content": "hi", "conversation": 987654}', "not_found"),
    ('{"type": "message", "content": "hi", "profile": 987654}', "not_found"),
    ('{"type": "regenerate", "conversation": 987654}', "not_found"),
]


@pytest.mark.parametrize(("text", "code"), BAD_FRAMES)
async def test_a_bad_frame_gets_an_error_frame_and_the_socket_stays_usable(
    quick_profile, alice, text, code
) -> None:
    ws = await chat_socket(alice)
    try:
        await ws.send_to(text_data=text)
        frame = await ws.receive_json_from(timeout=TIMEOUT_S)
        assert frame["type"] == "error" and frame["code"] == code, frame
        assert frame["message"]
        await assert_still_usable(ws)
    finally:
        await ws.disconnect()


async def test_binary_frames_get_an_error_frame(alice) -> None:
    ws = await chat_socket(alice)
    try:
        await ws.send_to(bytes_data=b"\x00\x01")
        frame = await ws.receive_json_from(timeout=TIMEOUT_S)
        assert frame["code"] == "bad_frame"
        await assert_still_usable(ws)
    finally:
        await ws.disconnect()


@pytest.mark.parametrize(
    ("browser", "empty", "regenerate"),
    [
        ({}, "content must not be empty", "this conversation has no answer to regenerate"),
        ({"accept_language": "zh-CN,zh;q=0.9"}, "消息内容不能为空", "此对话中没有可重新生成的回答"),
        (
            {"accept_language": "zh-CN", "cookies": {"django_language": "en"}},
            "content must not be empty",
            "this conversation has no answer to regenerate",
        ),
        ({"cookies": {"django_language": "zh-hans"}}, "消息内容不能为空", None),
    ],
    ids=["default", "accept-language", "switched-to-english", "switched-to-chinese"],
)
async def test_errors_a_user_can_meet_come_in_the_language_of_their_page(
    alice, browser, empty, regenerate
) -> None:
    conversation = await sync_to_async(Conversation.objects.create)(owner=alice)
    ws = await communicator("/ws/chat/", alice, **browser)
    assert (await ws.connect())[0]
    try:
        await ws.send_json_to({"type": "message", "content": "   "})
        frame = await ws.receive_json_from(timeout=TIMEOUT_S)
        assert (frame["code"], frame["message"]) == ("invalid", empty)
        if regenerate:
            await ws.send_json_to({"type": "regenerate", "conversation": conversation.pk})
            frames = await frames_until(ws, "error")
            assert frames[-1]["message"] == regenerate
        # A broken client's protocol errors stay English, as docs/chat-protocol.md writes them.
        await ws.send_to(text_data="[1]")
        assert (await ws.receive_json_from(timeout=TIMEOUT_S))["message"] == (
            "frames must be JSON objects"
        )
    finally:
        await ws.disconnect()


async def test_another_users_conversation_gets_not_found_and_is_not_changed(
    served_engine, quick_profile, alice, bob
) -> None:
    conversation = await sync_to_async(Conversation.objects.create)(owner=alice, title="mine")
    ws = await chat_socket(bob)
    try:
        for frame in (
            {"type": "message", "conversation": conversation.pk, "content": "leak?"},
            {"type": "regenerate", "conversation": conversation.pk},
        ):
            await ws.send_json_to(frame)
            error = await ws.receive_json_from(timeout=TIMEOUT_S)
            assert error["type"] == "error" and error["code"] == "not_found"
    finally:
        await ws.disconnect()
    assert not await sync_to_async(Message.objects.filter(conversation=conversation).exists)()


async def test_a_second_message_while_one_runs_gets_busy(
    served_engine, quick_profile, alice
) -> None:
    ws = await chat_socket(alice)
    try:
        await ws.send_json_to({"type": "message", "content": "Say something."})
        await frames_until(ws, "start")
        await ws.send_json_to({"type": "message", "content": "And more."})
        frames = await frames_until(ws, "error")
        assert frames[-1]["code"] == "busy"
        await frames_until(ws, "done")
    finally:
        await ws.disconnect()


async def test_a_message_longer_than_the_context_gets_context_overflow_and_is_kept(
    served_engine, quick_profile, alice
) -> None:
    # 8000 characters (the message limit) of CJK text: ~16000 tokens, four times the context.
    content = "\u4f11\u5047\u653f\u7b56" * 2000
    ws = await chat_socket(alice)
    try:
        await ws.send_json_to({"type": "message", "conversation": None, "content": content})
        start, error = await frames_until(ws, "error")
        assert start["type"] == "start" and start["user_message"]["content"] == content
        assert error["code"] == "context_overflow" and "tokens" in error["message"]
        assert error["conversation"] == start["conversation"]["id"]
        await assert_still_usable(ws)
    finally:
        await ws.disconnect()
    [question] = await sync_to_async(list)(
        Message.objects.filter(conversation_id=start["conversation"]["id"])
    )
    assert question.role == "user" and question.content == content


async def test_anonymous_and_cross_origin_sockets_are_refused(alice) -> None:
    anonymous = await communicator("/ws/chat/", None)
    connected, code = await anonymous.connect()
    assert not connected and code == CLOSE_UNAUTHENTICATED
    foreign = await communicator("/ws/chat/", alice, origin=b"http://evil.example")
    connected, _ = await foreign.connect()
    assert not connected


KNOWN_FRAME_TYPES = {"start", "sources", "token", "done", "error", "pong"}
KNOWN_ERROR_CODES = {
    "bad_json", "bad_frame", "unknown_type", "invalid", "too_long", "not_found", "busy",
    "nothing_to_regenerate", "context_overflow", "engine_unavailable", "engine_error",
}  # fmt: skip
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = ("content", "conversation", "collections", "profile", "seed")
FUZZED_FRAMES = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "stop", "regenerate", "ping", "launch"])},
        optional={name: JSON_VALUES for name in FIELDS},
    ).map(json.dumps),
    JSON_VALUES.map(json.dumps),
    # NOTE: min_size 1: the test communicator cannot send an empty text frame.
    st.text(min_size=1, max_size=200),
)


async def settle(ws) -> list[dict]:
    """Frames until the ping sent after the fuzzed frame is answered and no turn is running."""
    await ws.send_json_to({"type": "ping"})
    frames, turn_running, ponged = [], False, False
    while not ponged or turn_running:
        frame = await ws.receive_json_from(timeout=TIMEOUT_S)
        frames.append(frame)
        if frame["type"] == "start":
            turn_running = True
        elif frame["type"] in {"done", "error"} and turn_running and frame.get("code") != "busy":
            turn_running = False
        elif frame["type"] == "pong":
            ponged = True
    return frames


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(text=FUZZED_FRAMES)
async def test_fuzzed_frames_get_protocol_frames_only_and_the_socket_stays_usable(
    served_engine, quick_profile, alice, text
) -> None:
    await sync_to_async(type(quick_profile).objects.filter(pk=quick_profile.pk).update)(
        max_tokens=2
    )
    ws = await chat_socket(alice)
    try:
        await ws.send_to(text_data=text)
        for frame in await settle(ws):
            assert frame["type"] in KNOWN_FRAME_TYPES, frame
            if frame["type"] == "error":
                assert frame["code"] in KNOWN_ERROR_CODES and frame["message"], frame
    finally:
        await ws.disconnect()


async def test_a_flood_of_frames_is_answered_in_order_and_huge_frames_are_refused(alice) -> None:
    ws = await chat_socket(alice)
    try:
        for _ in range(500):
            await ws.send_json_to({"type": "ping"})
        await ws.send_to(text_data="x" * 2_000_000)
        await ws.send_to(bytes_data=b"\x00" * 100_000)
        for _ in range(500):
            assert await ws.receive_json_from(timeout=TIMEOUT_S) == {"type": "pong"}
        assert (await ws.receive_json_from(timeout=TIMEOUT_S))["code"] == "too_long"
        assert (await ws.receive_json_from(timeout=TIMEOUT_S))["code"] == "bad_frame"
        await assert_still_usable(ws)
    finally:
        await ws.disconnect()
