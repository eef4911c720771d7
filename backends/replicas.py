"""Replica selection with failover: which backend of a model's pool takes a request.

The enabled backends serving one model are its replicas; CACHET_ROUTING chooses how a request
picks one:

- `prefix` (the default): by the conversation's opening (backends.prefix_routing). Replicas
  that are healthy, not yet checked, or marked down but rested CACHET_BACKEND_RETRY_S (the
  request itself is their re-check) are on a consistent-hash ring; a request tries them in its
  key's ring order, replicas at their load bound last. A replica marked down and still resting
  is off the ring: its keys go to the next replica on the ring, and come back once it is tried
  again and answers (or a health check marks it up).
- `random`: healthy (or not yet checked) replicas first, in a random order weighted by `weight`
  (a replica of weight 3 comes first three times as often as one of weight 1); rested replicas
  marked down follow, resting ones are skipped.

`open_stream` tries them in that order until one accepts the request: a replica that cannot take
it is marked down and the next one is tried, so a stopped server costs one failed connection. A
stream that breaks once it has started (the replica died mid-answer) marks its replica down too;
that answer ends as an error (its tokens already reached the client), the next request goes
elsewhere. Open streams are counted per replica for the load bound until they are closed (or
garbage-collected).

Most sites enable no backend at all, so "none is enabled" is remembered (`enabled_backends`):
then routing a turn reads nothing from the database.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import weakref
from collections.abc import Sequence

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from backends import metrics
from backends.client import BackendUnavailable, RemoteStream, chat_payload
from backends.health import amark_down, amark_up
from backends.models import InferenceBackend
from backends.prefix_routing import InFlight, bounded_order, prefix_key, ring_order
from inference.engine import SamplingParams

logger = logging.getLogger(__name__)

# How long another process's "none is enabled" may stand after a backend is enabled here.
NONE_ENABLED_TTL_S = 5.0
ROUTING_MODES = ("prefix", "random")  # CACHET_ROUTING

# This process's open streams per replica name: the load the bound of prefix routing looks at.
in_flight = InFlight()


class NoReplicaAvailable(RuntimeError):
    """Every replica of the model failed or is marked down."""


def weighted_order(
    replicas: Sequence[InferenceBackend], rng: random.Random | None = None
) -> list[InferenceBackend]:
    """`replicas` in a random order where each comes first with a chance in proportion to weight.

    NOTE: Efraimidis-Spirakis sampling: sorting by u ** (1 / weight) draws without replacement
    by weight, so the second choice is also weighted among the rest.
    """
    rng = rng or random
    return sorted(replicas, key=lambda b: rng.random() ** (1.0 / max(b.weight, 1)), reverse=True)


def order_replicas(
    replicas: Sequence[InferenceBackend],
    *,
    key: bytes | None = None,
    now=None,
    rng: random.Random | None = None,
) -> list[InferenceBackend]:
    """The order to try `replicas` in for a request of routing key `key` (see the module doc);
    replicas resting after a failure are left out. Without a key, or with CACHET_ROUTING
    `random`, the random weighted order."""
    now = now or timezone.now()
    if key is not None and settings.CACHET_ROUTING == "prefix":
        on_ring = [b for b in replicas if b.is_due_for_retry(now)]
        return bounded_order(ring_order(on_ring, key), in_flight.snapshot())
    usable = [b for b in replicas if b.health != InferenceBackend.Health.DOWN]
    retry = [
        b for b in replicas if b.health == InferenceBackend.Health.DOWN and b.is_due_for_retry(now)
    ]
    retry.sort(key=lambda b: b.health_checked_at or now)  # the longest rested first
    return weighted_order(usable, rng) + retry


def replicas_of(model: str) -> list[InferenceBackend]:
    return list(InferenceBackend.objects.filter(model=model, is_enabled=True))


class _NoneEnabled:
    """The remembered answer "no backend is enabled", and the saves that make it stale.

    NOTE: only the empty answer is remembered; a list of enabled backends is read afresh every
    time, so a backend disabled anywhere gets no further requests. A save or delete in this
    process forgets it at once (and again when its transaction commits, so a read that ran before
    the commit cannot bring it back). A backend enabled by another process (a second daphne, a
    shell) is seen within NONE_ENABLED_TTL_S; until then turns stay on the in-process engine.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until = -math.inf  # time.monotonic() until which the answer holds
        self._generation = 0  # bumped by every forget(); a read older than it is not kept

    def holds(self) -> bool:
        return time.monotonic() < self._until

    def generation(self) -> int:
        return self._generation

    def remember(self, read_at_generation: int) -> None:
        with self._lock:
            if read_at_generation == self._generation:
                self._until = time.monotonic() + NONE_ENABLED_TTL_S

    def forget(self) -> None:
        with self._lock:
            self._generation += 1
            self._until = -math.inf


_none_enabled = _NoneEnabled()


def enabled_backends() -> list[InferenceBackend]:
    """The enabled backends; [] without a query while none is known to be enabled."""
    if _none_enabled.holds():
        return []
    generation = _none_enabled.generation()
    backends = list(InferenceBackend.objects.filter(is_enabled=True))
    if not backends:
        _none_enabled.remember(generation)
    return backends


@receiver(post_save, sender=InferenceBackend, dispatch_uid="backends.replicas.saved")
@receiver(post_delete, sender=InferenceBackend, dispatch_uid="backends.replicas.deleted")
def _forget_none_enabled(**kwargs) -> None:
    _none_enabled.forget()
    transaction.on_commit(_none_enabled.forget, using=kwargs.get("using"))


def remote_models() -> list[str]:
    """The models of the enabled backends, by name."""
    return sorted({backend.model for backend in enabled_backends()})


@database_sync_to_async
def _replicas_to_try(model: str, key: bytes) -> list[InferenceBackend]:
    return order_replicas(replicas_of(model), key=key)


def _counted(stream: RemoteStream) -> RemoteStream:
    """`stream`, counted in flight on its replica until it is closed or garbage-collected; when
    it broke mid-answer, its replica is marked down as it closes."""
    name = stream.backend.name
    in_flight.begin(name)
    # NOTE: a stream its caller drops without closing must not hold its count for ever.
    finished = weakref.finalize(stream, in_flight.end, name)

    async def on_close(closed: RemoteStream) -> None:
        finished()
        if closed.failure is not None:
            logger.warning("backend %s failed mid-answer: %s", name, closed.failure)
            await amark_down(closed.backend, closed.failure)

    stream.on_close = on_close
    return stream


async def open_stream(
    model: str, messages: list[dict], params: SamplingParams, request_id: str
) -> RemoteStream:
    """An opened stream of `model` on the first replica that accepts the request.

    Raises `NoReplicaAvailable` when none does, `RemoteRequestError` when one refuses the request
    itself (another would refuse it too).
    """
    payload = chat_payload(model, messages, params)
    failures: list[str] = []
    for backend in await _replicas_to_try(model, prefix_key(messages)):
        stream = _counted(
            RemoteStream(backend, payload, request_id, timeout_s=settings.CACHET_BACKEND_TIMEOUT_S)
        )
        try:
            await stream.open()
        except BackendUnavailable as error:
            logger.warning("backend %s could not take %s: %s", backend.name, request_id, error)
            metrics.record_failover(backend.name)
            failures.append(f"{backend.name}: {error}")
            await amark_down(backend, str(error))
            continue
        await amark_up(backend)
        return stream
    reason = "; ".join(failures) or "no replica is enabled, or all are resting after a failure"
    raise NoReplicaAvailable(f"no backend of model {model!r} could take the request ({reason})")
