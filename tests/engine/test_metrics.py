"""EngineMetrics: Prometheus objects in a per-engine registry and a plain snapshot."""

from __future__ import annotations

from prometheus_client import generate_latest

from inference.engine.metrics import EngineMetrics


def test_each_engine_has_its_own_registry():
    first, second = EngineMetrics(), EngineMetrics()
    first.record_finished("stop")
    assert first.snapshot()["num_requests"] == 1
    assert second.snapshot()["num_requests"] == 0


def test_snapshot_reports_counts_rates_and_latencies():
    metrics = EngineMetrics()
    metrics.record_step(
        num_running=3, num_waiting=2, kv_usage=0.5, num_preempted=1, num_generated=4
    )
    metrics.record_first_token(0.2, num_prompt_tokens=100, num_cached=75)
    metrics.record_first_token(0.4, num_prompt_tokens=100, num_cached=0)
    metrics.record_inter_token_latency(0.05)
    metrics.record_finished("length")
    metrics.record_finished("abort")
    snapshot = metrics.snapshot()
    assert snapshot["num_running"] == 3
    assert snapshot["num_waiting"] == 2
    assert snapshot["kv_usage"] == 0.5
    assert snapshot["num_preemptions"] == 1
    assert snapshot["prompt_tokens"] == 200
    assert snapshot["cached_prompt_tokens"] == 75
    assert snapshot["prefix_cache_hit_rate"] == 0.375
    assert abs(snapshot["ttft_mean_s"] - 0.3) < 1e-9
    assert snapshot["itl_mean_s"] == 0.05
    assert snapshot["generation_tokens"] == 4
    assert snapshot["tokens_per_s"] > 0
    assert snapshot["num_requests"] == 2
    assert snapshot["num_requests_by_finish_reason"]["length"] == 1


def test_the_registry_exposes_prometheus_text():
    metrics = EngineMetrics()
    metrics.record_step(num_running=1, num_waiting=0, kv_usage=0.25)
    text = generate_latest(metrics.registry).decode()
    assert "cachet_engine_kv_cache_usage_ratio 0.25" in text
    assert "cachet_engine_time_to_first_token_seconds_bucket" in text
