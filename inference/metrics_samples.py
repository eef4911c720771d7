"""One reading of the engine's and the backends' Prometheus series, as plain numbers.

The dashboard (inference/metrics_history.py) keeps such readings over the last hour; the values
are the same series `/metrics` serves (inference/engine/metrics.py, backends/metrics.py), read
from the same registries, so the dashboard and a Prometheus scrape of one process agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.utils import floatToGoString

from inference.engine.metrics import FINISH_REASONS, ITL_BUCKETS, PREFIX, TTFT_BUCKETS

TTFT = f"{PREFIX}_time_to_first_token_seconds"
ITL = f"{PREFIX}_inter_token_latency_seconds"


@dataclass(frozen=True, slots=True)
class EngineReading:
    """The in-process engine's series at `time` (unix seconds); counters since it started."""

    time: float
    model: str
    engine_id: int  # a replaced engine (reload) starts its counters again from zero
    num_running: int
    num_waiting: int
    kv_usage: float
    prompt_tokens: int
    cached_prompt_tokens: int
    generation_tokens: int
    num_preemptions: int
    requests_by_finish_reason: dict[str, int]
    ttft_cumulative: tuple[float, ...]  # counts at or below each TTFT_BUCKETS bound, then total
    itl_cumulative: tuple[float, ...]
    ttft_sum: float = 0.0
    itl_sum: float = 0.0

    @property
    def num_requests(self) -> int:
        return sum(self.requests_by_finish_reason.values())


@dataclass(frozen=True, slots=True)
class BackendReading:
    """Chat turns by the backend that answered and how they ended, at `time`."""

    time: float
    turns: dict[str, dict[str, int]] = field(default_factory=dict)  # backend -> outcome -> n


def sample_values(
    registry: CollectorRegistry,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of `registry` by (name, sorted labels), read in one pass."""
    values = {}
    for metric in registry.collect():
        for sample in metric.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def _cumulative(values: dict, name: str, bounds: tuple[float, ...]) -> tuple[float, ...]:
    # NOTE: prometheus_client labels a bucket with its bound formatted by floatToGoString.
    labels = [floatToGoString(bound) for bound in bounds] + ["+Inf"]
    return tuple(values.get((f"{name}_bucket", (("le", le),)), 0.0) for le in labels)


def read_engine(
    registry: CollectorRegistry, *, time: float, model: str, engine_id: int
) -> EngineReading:
    values = sample_values(registry)

    def value(name: str) -> float:
        found = values.get((f"{PREFIX}_{name}", ()), 0.0)
        return 0.0 if math.isnan(found) else found

    by_reason = {
        reason: int(values.get((f"{PREFIX}_requests_total", (("finish_reason", reason),)), 0))
        for reason in FINISH_REASONS
    }
    return EngineReading(
        time=time,
        model=model,
        engine_id=engine_id,
        num_running=int(value("requests_running")),
        num_waiting=int(value("requests_waiting")),
        kv_usage=value("kv_cache_usage_ratio"),
        prompt_tokens=int(value("prompt_tokens_total")),
        cached_prompt_tokens=int(value("cached_prompt_tokens_total")),
        generation_tokens=int(value("generation_tokens_total")),
        num_preemptions=int(value("preemptions_total")),
        requests_by_finish_reason=by_reason,
        ttft_cumulative=_cumulative(values, TTFT, TTFT_BUCKETS),
        itl_cumulative=_cumulative(values, ITL, ITL_BUCKETS),
        ttft_sum=values.get((f"{TTFT}_sum", ()), 0.0),
        itl_sum=values.get((f"{ITL}_sum", ()), 0.0),
    )


def read_backends(registry: CollectorRegistry, *, time: float) -> BackendReading:
    turns: dict[str, dict[str, int]] = {}
    for (name, labels), count in sample_values(registry).items():
        if name != "cachet_backend_requests_total":
            continue
        label = dict(labels)
        turns.setdefault(label["backend"], {})[label["outcome"]] = int(count)
    return BackendReading(time=time, turns=turns)
