"""Prefix-aware replica choice: consistent hashing of a conversation's opening, with bounded load.

A replica's prefix cache only helps a request whose prompt starts like one it computed before, so
every turn of a conversation should reach the replica that answered its earlier turns. The key
of a chat request is therefore what all its turns share, known before sending:

- `prefix_key(messages)`: SHA-256 of the system messages and the first user message, as text
  (role and content as canonical JSON, at most MAX_KEY_BYTES of it). History is append-only
  (every later turn starts with exactly these messages), so turn 1 and turn 10 of a chat have
  the same key, and two chats that open alike share the cached opening anyway.
  NOTE: text, not tokens: the router cannot tokenize for a replica (vLLM serves another model
  with its own tokenizer), and the key needs no block structure: nothing is matched block by
  block, one digest of the opening names the conversation. Nor the whole conversation so far:
  that changes every turn and would send every turn to a new replica.
- `HashRing`: VNODES_PER_WEIGHT points per unit of weight per replica, placed by SHA-256 of the
  replica's name, so every server process builds the same ring from the same rows (no shared
  state), a replica gets keys in proportion to its weight, and adding or removing one moves only
  its own share of the keys. A key goes to the first replica clockwise from its point, then the
  next distinct ones (the failover order).
- `bounded_order`: consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
  2018; HAProxy's hash-balance-factor): a replica already holding at least LOAD_FACTOR x its
  weighted share of the requests in flight (counting this one) is moved behind the others, so a
  popular opening cannot pile onto one replica while another idles. The counts are this server
  process's own (`InFlight`): each process bounds its own share, as each is its own router.

Which replicas are on the ring (healthy or due for a retry) is `backends.replicas`' concern.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

# Ring points per unit of weight: enough that shares follow weights within a few percent; fewer
# when the weights add up to more than MAX_RING_POINTS / VNODES_PER_WEIGHT (weights are relative).
VNODES_PER_WEIGHT = 160
MAX_RING_POINTS = 8192
# A replica at or above this multiple of its share of the requests in flight is skipped.
LOAD_FACTOR = 1.25
# The most of a conversation's opening the key covers: a longer one is as good as unique by then.
MAX_KEY_BYTES = 64 * 1024


class Replica(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> int: ...


R = TypeVar("R", bound=Replica)


def prefix_key(messages: Sequence[Mapping]) -> bytes:
    """The routing key of a chat request: SHA-256 of its conversation's opening (module doc).

    The opening is the messages up to and including the first user message (all of them when
    there is no user message).
    """
    opening = []
    for message in messages:
        opening.append([message.get("role"), message.get("content")])
        if message.get("role") == "user":
            break
    text = json.dumps(opening, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()[:MAX_KEY_BYTES]).digest()


def _point(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


@dataclass(frozen=True, slots=True)
class HashRing:
    """The ring of replica names (see the module doc); `walk(key)` is a key's order."""

    points: tuple[int, ...]  # sorted
    owners: tuple[str, ...]  # the replica name at each point
    num_replicas: int

    @classmethod
    def of(cls, replicas: Sequence[tuple[str, int]]) -> HashRing:
        """The ring of (name, weight) pairs; built once per distinct set (`ring_of`)."""
        total_weight = sum(max(weight, 1) for _, weight in replicas)
        per_weight = min(VNODES_PER_WEIGHT, MAX_RING_POINTS / max(total_weight, 1))
        placed = sorted(
            (_point(f"{name}\x00{index}".encode()), name)
            for name, weight in replicas
            for index in range(max(1, round(per_weight * max(weight, 1))))
        )
        return cls(
            tuple(point for point, _ in placed),
            tuple(name for _, name in placed),
            len({name for name, _ in replicas}),
        )

    def walk(self, key: bytes) -> list[str]:
        """Every replica name once, in ring order from `key`'s point."""
        names: list[str] = []
        if not self.points:
            return names
        start = bisect.bisect(self.points, int.from_bytes(key[:8], "big"))
        for offset in range(len(self.points)):
            name = self.owners[(start + offset) % len(self.points)]
            if name not in names:
                names.append(name)
                if len(names) == self.num_replicas:
                    break
        return names


@functools.lru_cache(maxsize=32)
def ring_of(replicas: tuple[tuple[str, int], ...]) -> HashRing:
    return HashRing.of(replicas)


def ring_order(replicas: Sequence[R], key: bytes) -> list[R]:
    """`replicas` in `key`'s ring order."""
    by_name = {replica.name: replica for replica in replicas}
    ring = ring_of(tuple(sorted((replica.name, replica.weight) for replica in replicas)))
    return [by_name[name] for name in ring.walk(key)]


def bounded_order(order: Sequence[R], in_flight: Mapping[str, int]) -> list[R]:
    """`order` with the replicas at their load bound moved behind the others (module doc).

    The bound of a replica of weight w among weights summing to W, with n requests in flight
    (this one included): ceil(LOAD_FACTOR * n * w / W). Their sum is above n - 1, so at least
    one replica is under its bound.
    """
    num_in_flight = sum(in_flight.get(replica.name, 0) for replica in order) + 1
    total_weight = sum(max(replica.weight, 1) for replica in order)
    under, over = [], []
    for replica in order:
        bound = math.ceil(LOAD_FACTOR * num_in_flight * max(replica.weight, 1) / total_weight)
        (under if in_flight.get(replica.name, 0) < bound else over).append(replica)
    return under + over


class InFlight:
    """This process's count of open requests per replica name (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def begin(self, name: str) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1

    def end(self, name: str) -> None:
        with self._lock:
            count = self._counts.get(name, 0) - 1
            if count > 0:
                self._counts[name] = count
            else:
                self._counts.pop(name, None)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
