"""Prometheus series of routing and remote backends, served with the engine's at /metrics.

`cachet_backend_requests_total{backend, outcome}` counts chat turns by the backend that answered
("local" is the in-process engine) and how they ended: ok, stopped, abort, error, or unavailable
(no replica could take it). `cachet_route_decisions_total{backend, reason}` counts the routing
rule that chose it; `cachet_backend_failovers_total{backend}` the replicas skipped because they
could not take a request.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

REGISTRY = CollectorRegistry()
REQUESTS = Counter(
    "cachet_backend_requests",
    "Chat turns by the backend that answered and how they ended",
    ["backend", "outcome"],
    registry=REGISTRY,
)
ROUTE_DECISIONS = Counter(
    "cachet_route_decisions",
    "Routing decisions by the backend chosen and the rule that chose it",
    ["backend", "reason"],
    registry=REGISTRY,
)
FAILOVERS = Counter(
    "cachet_backend_failovers",
    "Replicas skipped because they could not take a request",
    ["backend"],
    registry=REGISTRY,
)
OUTCOME_OF_FINISH = {"stop": "ok", "length": "ok", "stopped": "stopped", "abort": "abort"}


def record_request(backend: str, finish_reason: str | None) -> None:
    REQUESTS.labels(backend, OUTCOME_OF_FINISH.get(finish_reason or "", "error")).inc()


def record_unavailable(backend: str) -> None:
    REQUESTS.labels(backend, "unavailable").inc()


def record_route(backend: str, reason: str) -> None:
    ROUTE_DECISIONS.labels(backend, reason).inc()


def record_failover(backend: str) -> None:
    FAILOVERS.labels(backend).inc()
