"""backends.replicas: weighted order, resting after a failure, and failover to a live replica.

The live replica is a real remote Cachet server; the stopped one is an address where nothing
listens (a killed server, as far as a client can tell; tests/chat/test_turn_routing.py kills the
real one).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backends import metrics, replicas
from backends.client import RemoteStream
from backends.models import InferenceBackend
from backends.replicas import (
    NoReplicaAvailable,
    enabled_backends,
    open_stream,
    order_replicas,
    weighted_order,
)
from inference.engine.core.sampling_params import SamplingParams
from tests.remote_cachet import backend_for, unreachable_url

GREEDY = SamplingParams(temperature=0, max_tokens=4, seed=0)
MESSAGES = [{"role": "user", "content": "Say yes."}]


def replica(name: str, weight: int = 1, health: str = "unknown", rested_s: float = 0.0):
    checked = timezone.now() - timedelta(seconds=rested_s)
    return InferenceBackend(name=name, weight=weight, health=health, health_checked_at=checked)


def failovers_of(name: str) -> float:
    sample = metrics.REGISTRY.get_sample_value("cachet_backend_failovers_total", {"backend": name})
    return sample or 0.0


def test_replicas_come_first_in_proportion_to_their_weight() -> None:
    rng = random.Random(7)
    heavy, light = replica("heavy", weight=3), replica("light", weight=1)
    firsts = Counter(weighted_order([heavy, light], rng)[0].name for _ in range(4000))
    assert firsts["heavy"] / 4000 == pytest.approx(0.75, abs=0.03)


def test_a_replica_marked_down_rests_then_is_tried_after_the_healthy_ones(settings) -> None:
    settings.CACHET_BACKEND_RETRY_S = 30
    up = replica("up", health="up")
    unknown = replica("unknown")
    resting = replica("resting", health="down", rested_s=5)
    rested = replica("rested", health="down", rested_s=60)
    longer_rested = replica("longer", health="down", rested_s=600)
    order = order_replicas([rested, resting, up, longer_rested, unknown], rng=random.Random(1))
    assert {b.name for b in order[:2]} == {"up", "unknown"}
    assert [b.name for b in order[2:]] == ["longer", "rested"]


@pytest.mark.django_db(transaction=True)
async def test_a_stopped_replica_is_skipped_marked_down_and_left_to_rest(remote_cachet) -> None:
    model = remote_cachet.model
    stopped = backend_for(remote_cachet, name="stopped", base_url=unreachable_url(), weight=1000)
    live = backend_for(remote_cachet, name="live")
    await sync_to_async(stopped.save)()
    await sync_to_async(live.save)()
    before = failovers_of("stopped")

    stream = await open_stream(model, MESSAGES, GREEDY, "r1")
    assert isinstance(stream, RemoteStream) and stream.backend.name == "live"
    assert [item async for item in stream]  # it answers
    assert failovers_of("stopped") == before + 1
    rows = {b.name: b async for b in InferenceBackend.objects.all()}
    assert rows["stopped"].health == "down" and "ConnectError" in rows["stopped"].health_detail
    assert rows["live"].health == "up"

    stream = await open_stream(model, MESSAGES, GREEDY, "r2")  # the stopped one rests now
    await stream.aclose()
    assert stream.backend.name == "live" and failovers_of("stopped") == before + 1


@pytest.mark.django_db(transaction=True)
async def test_when_no_replica_can_take_a_request_the_error_names_each_failure(
    remote_cachet,
) -> None:
    await sync_to_async(backend_for(remote_cachet, name="a", base_url=unreachable_url()).save)()
    await sync_to_async(backend_for(remote_cachet, name="b", api_key="ck-wrong").save)()
    with pytest.raises(NoReplicaAvailable) as failed:
        await open_stream(remote_cachet.model, MESSAGES, GREEDY, "r3")
    assert "a: " in str(failed.value) and "b: " in str(failed.value)
    assert "HTTP 401" in str(failed.value)
    with pytest.raises(NoReplicaAvailable, match="resting"):  # both rest now
        await open_stream(remote_cachet.model, MESSAGES, GREEDY, "r4")


def backend_queries(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries if "backends_inferencebackend" in query["sql"]]


@pytest.mark.django_db
def test_while_no_backend_is_enabled_the_table_is_read_once_not_at_every_turn() -> None:
    InferenceBackend.objects.create(name="off", model="m", is_enabled=False)
    with CaptureQueriesContext(connection) as first:
        assert enabled_backends() == []
    with CaptureQueriesContext(connection) as later:
        assert enabled_backends() == [] and enabled_backends() == []
    assert len(backend_queries(first)) == 1 and backend_queries(later) == []


@pytest.mark.django_db
def test_saving_or_deleting_a_backend_here_is_seen_by_the_very_next_read() -> None:
    assert enabled_backends() == []
    backend = InferenceBackend.objects.create(name="gpu-1", model="m")
    assert enabled_backends() == [backend]
    backend.is_enabled = False
    backend.save()
    assert enabled_backends() == []
    backend.is_enabled = True
    backend.save()
    assert enabled_backends() == [backend]
    backend.delete()
    assert enabled_backends() == []


@pytest.mark.django_db
def test_enabled_backends_are_read_every_time_so_one_disabled_elsewhere_is_never_tried() -> None:
    backend = InferenceBackend.objects.create(name="gpu-1", model="m")
    assert enabled_backends() == [backend]
    # NOTE: update() sends no signal: this is how another process's change looks from here.
    InferenceBackend.objects.filter(pk=backend.pk).update(is_enabled=False)
    assert enabled_backends() == []


class FakeClock:
    """Stands in for the `time` module of backends.replicas."""

    def __init__(self) -> None:
        # NOTE: an hour in the past, so what the test leaves remembered has expired for the next.
        self.now = float(int(time.monotonic()) - 3600)  # whole seconds: exact sums

    def monotonic(self) -> float:
        return self.now


@pytest.mark.django_db
def test_a_backend_enabled_by_another_process_is_seen_once_the_remembered_answer_expires(
    monkeypatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(replicas, "time", clock)
    backend = InferenceBackend.objects.create(name="gpu-1", model="m", is_enabled=False)
    assert enabled_backends() == []
    InferenceBackend.objects.filter(pk=backend.pk).update(is_enabled=True)  # no signal here
    clock.now += replicas.NONE_ENABLED_TTL_S - 1
    assert enabled_backends() == []
    clock.now += 1
    assert enabled_backends() == [backend]
