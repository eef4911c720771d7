"""Prefix-aware routing of remote replicas: keys, the ring, the load bound, dead replicas.

The key and ring tests are plain functions (one of them in other processes). The rest run on two
real Cachet servers as the replicas: the session's `remote_cachet` ("a") and one more started
here ("b"), which the fault tests kill mid-answer and start again before they end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import User

from backends import metrics, replicas
from backends.client import RemoteStreamError
from backends.models import InferenceBackend
from backends.prefix_routing import (
    MAX_RING_POINTS,
    HashRing,
    bounded_order,
    prefix_key,
    ring_order,
)
from backends.replicas import open_stream, order_replicas
from chat.errors import ChatError
from chat.events import TokenDelta, TurnDone
from chat.models import AssistantProfile, Message
from chat.turn import TurnRequest, run_turn
from inference.engine.core.sampling_params import SamplingParams
from tests.remote_cachet import backend_for, start_remote_cachet

SYSTEM = {"role": "system", "content": "You are a helpful assistant of Northwind Logistics."}
SYSTEM_BRIEF = {"role": "system", "content": "Be brief."}
SHORT = SamplingParams(temperature=0, max_tokens=4, seed=0)
LONG = SamplingParams(temperature=0, max_tokens=400, seed=0, ignore_eos=True)
BLOCK_SIZE = 16  # the replicas' KV block size (EngineConfig.block_size)


def opening(number: int) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": f"Question {number}: how many holidays?"}]


def second_turn(number: int) -> list[dict]:
    return [
        *opening(number),
        {"role": "assistant", "content": "Thirty days."},
        {"role": "user", "content": "Can I carry some over?"},
    ]


def replica(name: str, weight: int = 1) -> SimpleNamespace:
    return SimpleNamespace(name=name, weight=weight)


def failovers_of(name: str) -> float:
    sample = metrics.REGISTRY.get_sample_value("cachet_backend_failovers_total", {"backend": name})
    return sample or 0.0


# ---- keys and the ring ----


def test_every_turn_of_a_conversation_has_the_key_of_its_opening() -> None:
    assert prefix_key(second_turn(1)) == prefix_key(opening(1))
    assert prefix_key(opening(1)) != prefix_key(opening(2))
    other_assistant = [{**SYSTEM, "content": "You are terse."}, opening(1)[1]]
    assert prefix_key(other_assistant) != prefix_key(opening(1))


ORDER_IN_A_CHILD = """
import sys
from types import SimpleNamespace
from backends.prefix_routing import prefix_key, ring_order
replicas = [SimpleNamespace(name=n, weight=w) for n, w in (("gpu-1", 1), ("gpu-2", 2), ("x", 1))]
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": sys.argv[1]}]
print(prefix_key(messages).hex(), [r.name for r in ring_order(replicas, prefix_key(messages))])
"""


def test_the_same_opening_maps_to_the_same_replica_order_in_every_process() -> None:
    def in_child(seed: str, question: str) -> str:
        env = os.environ | {"PYTHONHASHSEED": seed}
        child = [sys.executable, "-c", ORDER_IN_A_CHILD, question]
        return subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout

    pool = [replica("gpu-1"), replica("gpu-2", 2), replica("x")]
    for question in ("Hi", "Où est la gare ?", "How many days off?"):
        messages = [SYSTEM_BRIEF, {"role": "user", "content": question}]
        key = prefix_key(messages)
        here = f"{key.hex()} {[r.name for r in ring_order(pool, key)]}"
        assert in_child("1", question).strip() == in_child("2", question).strip() == here


def test_keys_spread_over_replicas_in_proportion_to_their_weight() -> None:
    pool = [replica("heavy", 3), replica("light-1"), replica("light-2")]
    firsts = Counter(ring_order(pool, prefix_key(opening(n)))[0].name for n in range(5000))
    assert firsts["heavy"] / 5000 == pytest.approx(0.6, abs=0.05)
    assert firsts["light-1"] / 5000 == pytest.approx(0.2, abs=0.05)
    assert firsts["light-2"] / 5000 == pytest.approx(0.2, abs=0.05)
    # Weights are relative: large ones give the same shares on a ring of bounded size.
    ring = HashRing.of([("heavy", 3000), ("light", 1000)])
    assert len(ring.points) <= MAX_RING_POINTS
    firsts = Counter(ring.walk(prefix_key(opening(n)))[0] for n in range(5000))
    assert firsts["heavy"] / 5000 == pytest.approx(0.75, abs=0.05)


def test_adding_a_replica_moves_only_the_keys_it_takes_over() -> None:
    before = [replica("a"), replica("b"), replica("c")]
    after = [*before, replica("d")]
    keys = [prefix_key(opening(n)) for n in range(3000)]
    moved = [ring_order(before, k)[0].name != ring_order(after, k)[0].name for k in keys]
    assert sum(moved) / len(keys) == pytest.approx(0.25, abs=0.05)
    assert all(ring_order(after, k)[0].name == "d" for k, m in zip(keys, moved, strict=True) if m)


def test_a_key_walks_every_replica_once_in_ring_order() -> None:
    ring = HashRing.of([("a", 1), ("b", 2), ("c", 1)])
    order = ring.walk(prefix_key(opening(3)))
    assert sorted(order) == ["a", "b", "c"]
    assert HashRing.of([]).walk(b"key") == []


def test_a_replica_at_1_25x_its_share_of_the_requests_in_flight_goes_behind_the_others() -> None:
    a, b, c = replica("a"), replica("b"), replica("c")
    # 6 in flight + this one: a replica's bound is ceil(1.25 * 7 / 3) = 3.
    assert bounded_order([a, b, c], {"a": 2, "b": 2, "c": 2}) == [a, b, c]
    assert bounded_order([a, b, c], {"a": 3, "b": 2, "c": 1}) == [b, c, a]
    # Weighted: "heavy" (3 of 4) may hold 1.25 * 3/4 of the requests in flight: with 15 and
    # this one, ceil(0.9375 * 16) = 15.
    heavy, light = replica("heavy", 3), replica("light")
    assert bounded_order([heavy, light], {"heavy": 14}) == [heavy, light]
    assert bounded_order([heavy, light], {"heavy": 15}) == [light, heavy]
    # Idle: nobody is over the bound.
    assert bounded_order([a, b], {}) == [a, b]


def test_random_routing_remains_available_as_a_setting(settings) -> None:
    settings.CACHET_ROUTING = "random"
    pool = [InferenceBackend(name=f"r{n}", health="up") for n in range(3)]
    firsts = Counter(order_replicas(pool, key=prefix_key(opening(1)))[0].name for _ in range(300))
    assert len(firsts) == 3  # the same key lands anywhere
    settings.CACHET_ROUTING = "prefix"
    firsts = Counter(order_replicas(pool, key=prefix_key(opening(1)))[0].name for _ in range(30))
    assert len(firsts) == 1


# ---- two real replicas ----


@pytest.fixture(scope="module")
def replica_b_server(chat_model_dir):
    """A second real Cachet server, replica "b" (the session's remote_cachet is "a")."""
    with start_remote_cachet(chat_model_dir) as live:
        yield live


@pytest.fixture
def pool(remote_cachet, replica_b_server, transactional_db, settings):
    """Rows "a" and "b" of one model (both servers serve the same directory under one name)."""
    settings.CACHET_BACKEND_RETRY_S = 1
    settings.CACHET_ROUTING = "prefix"
    a = backend_for(remote_cachet, name="a")
    b = backend_for(replica_b_server, name="b", model=remote_cachet.model)
    a.save()
    b.save()
    return SimpleNamespace(
        a=a,
        b=b,
        model=remote_cachet.model,
        b_server=replica_b_server,
        servers={"a": remote_cachet, "b": replica_b_server},
        settings=settings,
    )


def owned_by(pool, name: str, count: int = 1) -> list[int]:
    """Conversation numbers whose opening's first replica is `name`."""
    rows = [pool.a, pool.b]
    numbers = (n for n in range(1000) if ring_order(rows, prefix_key(opening(n)))[0].name == name)
    return [next(numbers) for _ in range(count)]


async def health_of(backend: InferenceBackend) -> InferenceBackend:
    return await InferenceBackend.objects.aget(pk=backend.pk)


async def answered_by(pool, messages: list[dict], params: SamplingParams = SHORT) -> str:
    stream = await open_stream(pool.model, messages, params, "t")
    items = [item async for item in stream]
    assert items and items[-1].completion_tokens > 0
    return stream.backend.name


async def test_every_turn_of_a_chat_reaches_the_replica_that_answered_its_first(pool) -> None:
    user = await User.objects.acreate(username="carol")
    await AssistantProfile.objects.acreate(
        name="Remote", is_default=True, temperature=0, max_tokens=8
    )
    for chat in range(4):
        question = f"Hi, this is chat {chat}. How many days of holiday do I get?"
        first = await answer_of(pool, user, question)
        second = await answer_of(pool, user, "And can I carry some over?", after=first)
        assert second.backend == first.backend
        # That replica computed turn 1's prompt: turn 2 takes all its full blocks from the cache.
        assert second.cached_tokens >= first.prompt_tokens - BLOCK_SIZE


async def answer_of(pool, user: User, content: str, *, after: Message | None = None) -> Message:
    """The saved answer to `content` from the pool's model, in `after`'s chat or a new one."""
    conversation = None if after is None else after.conversation_id
    request = TurnRequest(user, content, conversation_id=conversation, model=pool.model)
    events = [event async for event in run_turn(request)]
    assert isinstance(events[-1], TurnDone), events
    return await Message.objects.aget(pk=events[-1].message.pk)


async def test_a_replica_at_its_load_bound_is_skipped_for_the_next_on_the_ring(pool) -> None:
    (number,) = owned_by(pool, "a")
    held = [await open_stream(pool.model, opening(number), SHORT, f"h{n}") for n in range(2)]
    try:
        assert [stream.backend.name for stream in held] == ["a", "a"]
        # 3 in flight with this one: "a" may hold ceil(1.25 * 3 / 2) = 2, it has 2.
        third = await open_stream(pool.model, opening(number), SHORT, "h3")
        held.append(third)
        assert third.backend.name == "b"
        assert replicas.in_flight.snapshot() == {"a": 2, "b": 1}
    finally:
        for stream in held:
            await stream.aclose()
    assert replicas.in_flight.snapshot() == {}
    assert await answered_by(pool, opening(number)) == "a"


async def test_a_dead_replicas_keys_move_to_the_next_and_come_back_when_it_is_healthy(
    pool,
) -> None:
    numbers = owned_by(pool, "b", count=3)
    assert {await answered_by(pool, opening(n)) for n in numbers} == {"b"}
    pool.settings.CACHET_BACKEND_RETRY_S = 60
    await asyncio.to_thread(pool.b_server.kill)
    try:
        before = failovers_of("b")
        assert [await answered_by(pool, opening(n)) for n in numbers] == ["a", "a", "a"]
        assert failovers_of("b") == before + 1  # one failed connection; then "b" rests
        assert (await health_of(pool.b)).health == "down"
        assert await answered_by(pool, opening(owned_by(pool, "a")[0])) == "a"
    finally:
        await asyncio.to_thread(pool.b_server.start)
    pool.settings.CACHET_BACKEND_RETRY_S = 1
    await asyncio.sleep(1.1)  # "b" has rested: back on the ring, the next request re-checks it
    assert [await answered_by(pool, opening(n)) for n in numbers] == ["b", "b", "b"]
    assert (await health_of(pool.b)).health == "up"


async def test_a_replica_dying_mid_answer_ends_that_answer_as_an_error_and_leaves_the_ring(
    pool,
) -> None:
    (number,) = owned_by(pool, "b")
    pool.settings.CACHET_BACKEND_RETRY_S = 60
    stream = await open_stream(pool.model, opening(number), LONG, "dies")
    assert stream.backend.name == "b"
    received = []
    try:
        with pytest.raises(RemoteStreamError, match="the stream broke"):
            async for item in stream:
                received.append(item)
                if len(received) == 2:
                    await asyncio.to_thread(pool.b_server.kill)
        assert replicas.in_flight.snapshot() == {}
        row = await health_of(pool.b)
        assert row.health == "down" and "the stream broke" in row.health_detail
        before = failovers_of("b")
        assert await answered_by(pool, second_turn(number)) == "a"
        assert failovers_of("b") == before  # "b" is off the ring: not even tried
    finally:
        await asyncio.to_thread(pool.b_server.start)
    pool.settings.CACHET_BACKEND_RETRY_S = 1
    await asyncio.sleep(1.1)
    assert await answered_by(pool, second_turn(number)) == "b"


async def test_a_chat_answer_cut_by_a_dying_replica_is_saved_as_an_error_and_the_chat_goes_on(
    pool,
) -> None:
    user = await User.objects.acreate(username="dave")
    await AssistantProfile.objects.acreate(
        name="Long", is_default=True, temperature=0, max_tokens=400
    )
    pool.settings.CACHET_BACKEND_RETRY_S = 60
    request = TurnRequest(user=user, content="Tell me about holidays.", model=pool.model)
    num_deltas, killed = 0, None
    with pytest.raises(ChatError) as failed:
        async for event in run_turn(request):
            num_deltas += isinstance(event, TokenDelta)
            if num_deltas == 2 and killed is None:
                (name,) = replicas.in_flight.snapshot()  # the replica answering
                killed = pool.servers[name]
                await asyncio.to_thread(killed.kill)
    try:
        assert failed.value.code == "engine_error"
        cut = await Message.objects.filter(role="assistant").alatest("id")
        assert (cut.backend, cut.finish_reason) == (name, "error")
        assert cut.content  # what had arrived is kept
        follow_up = await answer_of(pool, user, "Please go on.", after=cut)
        assert follow_up.backend == ({"a", "b"} - {name}).pop()
        assert follow_up.finish_reason in ("stop", "length") and follow_up.content
    finally:
        await asyncio.to_thread(killed.start)
