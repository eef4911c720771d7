"""The staff dashboard's numbers, from metric readings (inference/metrics_samples.py).

Counters only grow while one engine lives, so every rate is a difference of two readings: the
prefix-cache hit rate and the latency percentiles of a point cover the trend window (the minute)
up to it, tokens/s the interval since the reading before. Percentiles come from the histograms'
buckets, each with the bucket it lies in (inference/histogram_percentiles.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from inference.engine.metrics import ITL_BUCKETS, TTFT_BUCKETS
from inference.histogram_percentiles import bucket_difference, estimate_percentiles
from inference.metrics_samples import BackendReading, EngineReading

TREND_WINDOW_S = 60.0


def _increase(newer: EngineReading, older: EngineReading | None, field: str) -> int:
    """How much a counter grew; from zero when `older` is another (replaced) engine's."""
    new_value: int = getattr(newer, field)
    if older is None or older.engine_id != newer.engine_id:
        return new_value
    return max(0, new_value - getattr(older, field))


def _histogram(newer: EngineReading, older: EngineReading | None, field: str) -> Sequence[float]:
    new_counts: tuple[float, ...] = getattr(newer, field)
    if older is None or older.engine_id != newer.engine_id:
        return new_counts
    return bucket_difference(new_counts, getattr(older, field))


def latency_percentiles(cumulative: Sequence[float], bounds: Sequence[float]) -> dict:
    """{"count", "p50", "p90", "p99"}: each percentile's estimate and bucket, or None."""
    estimates = {
        f"p{round(e.quantile * 100)}": e.as_json() for e in estimate_percentiles(bounds, cumulative)
    }
    return {
        "count": int(cumulative[-1]),
        **{key: estimates.get(key) for key in ("p50", "p90", "p99")},
    }


def _between(newer: EngineReading, older: EngineReading | None) -> dict:
    """Hit rate and latency percentiles of what happened between two readings."""
    prompt = _increase(newer, older, "prompt_tokens")
    cached = _increase(newer, older, "cached_prompt_tokens")
    return {
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "hit_rate": cached / prompt if prompt else None,
        "ttft": latency_percentiles(_histogram(newer, older, "ttft_cumulative"), TTFT_BUCKETS),
        "itl": latency_percentiles(_histogram(newer, older, "itl_cumulative"), ITL_BUCKETS),
    }


def trend_baselines(times: Sequence[float], trend_s: float) -> list[int]:
    """For each reading time, the index of its trend window's baseline: the last reading at
    least `trend_s` before it, else (early in the series) the first reading."""
    baselines, base = [], 0
    for time in times:
        while base + 1 < len(times) and times[base + 1] <= time - trend_s:
            base += 1
        baselines.append(base)
    return baselines


def engine_points(readings: Sequence[EngineReading], trend_s: float = TREND_WINDOW_S) -> list[dict]:
    """One point per reading, oldest first: gauges as read, rates over the trend window."""
    points = []
    baselines = trend_baselines([reading.time for reading in readings], trend_s)
    for i, reading in enumerate(readings):
        previous = readings[i - 1] if i > 0 else None
        interval = reading.time - previous.time if previous is not None else 0.0
        generated = _increase(reading, previous, "generation_tokens") if previous else 0
        trend = _between(reading, readings[baselines[i]])
        points.append(
            {
                "t": reading.time,
                "num_running": reading.num_running,
                "num_waiting": reading.num_waiting,
                "kv_usage": reading.kv_usage,
                "tokens_per_s": generated / interval if interval > 0 else None,
                "hit_rate": trend["hit_rate"],
                "ttft": {key: trend["ttft"][key] for key in ("p50", "p90", "p99")},
                "itl": {key: trend["itl"][key] for key in ("p50", "p90", "p99")},
            }
        )
    return points


def totals(reading: EngineReading, since: EngineReading | None = None) -> dict:
    """Counts, hit rate and latency percentiles since `since` (None: since the engine started)."""
    by_reason = {
        reason: count
        - (since.requests_by_finish_reason.get(reason, 0) if _same(reading, since) else 0)
        for reason, count in reading.requests_by_finish_reason.items()
    }
    return {
        "num_requests": sum(by_reason.values()),
        "num_requests_by_finish_reason": by_reason,
        "generation_tokens": _increase(reading, since, "generation_tokens"),
        "num_preemptions": _increase(reading, since, "num_preemptions"),
        **_between(reading, since),
    }


def _same(newer: EngineReading, older: EngineReading | None) -> bool:
    return older is not None and older.engine_id == newer.engine_id


def model_series(
    model: str, readings: Sequence[EngineReading], *, is_current: bool, is_full: bool
) -> dict:
    """A model's chart points and its totals over the kept readings (the last hour).

    `is_full`: the ring buffer has started dropping readings older than the hour.
    """
    first, last = readings[0], readings[-1]
    # NOTE: until the ring is full, nothing was dropped: the hour holds everything since the
    # engine started (the sampler starts with it), so the totals count from zero; after that
    # the oldest kept reading is the hour's baseline.
    since = first if is_full else None
    return {
        "model": model,
        "is_current": is_current,
        "points": engine_points(readings),
        "window": {"from": (since or first).time, "to": last.time, **totals(last, since)},
    }


def backend_series(
    readings: Sequence[BackendReading], trend_s: float = TREND_WINDOW_S
) -> list[dict]:
    """Per backend: turns answered and failed in the trend window up to each reading."""
    names = sorted({name for reading in readings for name in reading.turns})
    baselines = trend_baselines([reading.time for reading in readings], trend_s)
    series = []
    for name in names:
        points = []
        for reading, base_index in zip(readings, baselines, strict=True):
            base = readings[base_index].turns.get(name, {})
            now = reading.turns.get(name, {})
            grown = {outcome: now.get(outcome, 0) - base.get(outcome, 0) for outcome in now}
            points.append(
                {
                    "t": reading.time,
                    "turns": sum(grown.values()),
                    "failed": grown.get("error", 0) + grown.get("unavailable", 0),
                }
            )
        series.append(
            {"backend": name, "points": points, "totals": readings[-1].turns.get(name, {})}
        )
    return series
