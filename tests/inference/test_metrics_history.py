"""The dashboard's readings of the engine's series, its bounded history and its derived numbers.

The readings come from a real EngineMetrics registry (the one `/metrics` serves), fed as the
engine feeds it.
"""

from __future__ import annotations

import pytest

from inference.dashboard_series import backend_series, engine_points, model_series, totals
from inference.engine.metrics import EngineMetrics
from inference.metrics_history import MAX_MODEL_SERIES, MetricsHistory
from inference.metrics_samples import BackendReading, read_engine

PREFIX = "cachet_engine"


def fed_metrics() -> EngineMetrics:
    metrics = EngineMetrics()
    metrics.record_first_token(0.3, num_prompt_tokens=100, num_cached=60)
    metrics.record_first_token(0.8, num_prompt_tokens=50, num_cached=0)
    for seconds in (0.02, 0.04, 0.06):
        metrics.record_inter_token_latency(seconds)
    metrics.record_step(num_running=2, num_waiting=1, kv_usage=0.25, num_generated=7)
    metrics.record_finished("stop")
    metrics.record_finished("length")
    return metrics


def test_a_reading_holds_the_same_numbers_as_the_registry_that_metrics_serves() -> None:
    metrics = fed_metrics()
    value = metrics.registry.get_sample_value
    reading = read_engine(metrics.registry, time=100.0, model="m", engine_id=1)
    assert reading.prompt_tokens == value(f"{PREFIX}_prompt_tokens_total") == 150
    assert reading.cached_prompt_tokens == value(f"{PREFIX}_cached_prompt_tokens_total") == 60
    assert reading.generation_tokens == 7
    assert (reading.num_running, reading.num_waiting, reading.kv_usage) == (2, 1, 0.25)
    assert reading.requests_by_finish_reason == {"stop": 1, "length": 1, "abort": 0, "error": 0}
    ttft = f"{PREFIX}_time_to_first_token_seconds_bucket"
    assert reading.ttft_cumulative[3] == value(ttft, {"le": "0.25"}) == 0
    assert reading.ttft_cumulative[4] == value(ttft, {"le": "0.5"}) == 1
    assert reading.ttft_cumulative[-1] == 2 and reading.itl_cumulative[-1] == 3


def test_totals_give_the_hit_rate_and_each_percentile_with_its_bucket() -> None:
    reading = read_engine(fed_metrics().registry, time=100.0, model="m", engine_id=1)
    result = totals(reading)
    assert result["num_requests"] == 2
    assert result["hit_rate"] == pytest.approx(60 / 150)
    p50 = result["ttft"]["p50"]  # the 1st of 2 TTFTs: 0.3 s, in (0.25, 0.5]
    assert (p50["lower"], p50["upper"]) == (0.25, 0.5) and 0.25 <= p50["value"] <= 0.5
    assert result["itl"]["count"] == 3


def test_points_take_rates_over_the_trend_window_and_a_new_engine_counts_from_zero() -> None:
    metrics = EngineMetrics()
    readings = [read_engine(metrics.registry, time=0.0, model="m", engine_id=1)]
    metrics.record_first_token(0.3, num_prompt_tokens=100, num_cached=90)
    metrics.record_step(num_running=1, num_waiting=0, kv_usage=0.1, num_generated=50)
    readings.append(read_engine(metrics.registry, time=10.0, model="m", engine_id=1))
    replaced = EngineMetrics()
    replaced.record_first_token(0.3, num_prompt_tokens=10, num_cached=0)
    readings.append(read_engine(replaced.registry, time=20.0, model="m", engine_id=2))
    points = engine_points(readings, trend_s=60.0)
    assert points[0]["hit_rate"] is None and points[0]["tokens_per_s"] is None
    assert points[1]["hit_rate"] == pytest.approx(0.9)
    assert points[1]["tokens_per_s"] == pytest.approx(5.0)
    # the replaced engine's 10 prompt tokens, none cached: not a negative difference
    assert points[2]["tokens_per_s"] == 0.0
    series = model_series("m", readings, is_current=True, is_full=False)
    assert series["window"]["prompt_tokens"] == 10  # the engine now running, since its start


def test_the_history_keeps_an_hour_of_readings_and_a_few_models_at_most() -> None:
    history = MetricsHistory(interval_s=600.0)  # an hour is 7 readings
    registry = EngineMetrics().registry
    for i in range(20):
        reading = read_engine(registry, time=float(i), model="a", engine_id=1)
        history.add(reading, BackendReading(time=float(i)))
    assert len(history.models()["a"]) == history.max_readings == 7
    assert len(history.backends()) == 7
    for i in range(MAX_MODEL_SERIES + 2):
        reading = read_engine(registry, time=0.0, model=f"m{i}", engine_id=1)
        history.add(reading, BackendReading(0.0))
    assert len(history.models()) == MAX_MODEL_SERIES
    assert "a" not in history.models()  # the model sampled longest ago goes first


def test_backend_points_count_the_turns_and_failures_of_the_trend_window() -> None:
    readings = [
        BackendReading(0.0, {"local": {"ok": 2}}),
        BackendReading(30.0, {"local": {"ok": 5}, "upstream": {"ok": 1, "unavailable": 1}}),
        BackendReading(90.0, {"local": {"ok": 6}, "upstream": {"ok": 1, "unavailable": 3}}),
    ]
    by_name = {series["backend"]: series for series in backend_series(readings, trend_s=60.0)}
    local, upstream = by_name["local"]["points"], by_name["upstream"]["points"]
    assert [point["turns"] for point in local] == [0, 3, 1]  # at 90 s: since the 30 s reading
    assert [point["failed"] for point in upstream] == [0, 1, 2]
    assert by_name["upstream"]["totals"] == {"ok": 1, "unavailable": 3}
