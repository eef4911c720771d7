"""bench.api at smoke sizes: the engine in process, then streaming OpenAI clients on a server."""

from __future__ import annotations

import json

import pytest

from bench import api as bench

pytestmark = pytest.mark.real_weights


def test_a_smoke_run_measures_the_engine_and_the_api_on_the_same_prompts(chat_model_dir) -> None:
    report = bench.run_bench(smoke=True, models_dir=chat_model_dir.parent)
    json.dumps(report)
    assert set(report) >= {"engine", "api", "ratio", "target_met", "config"}
    engine, api, config = report["engine"], report["api"], report["config"]
    assert config["concurrency"] == 2 and config["max_tokens"] == 4 and config["smoke"]
    assert config["model"] and config["engine_config"]["dtype"]
    assert api["errors"] == 0, api["error_details"]
    assert engine["requests"] == api["answered"] == 2
    # ignore_eos: every request produces all its tokens, on both sides.
    assert engine["completion_tokens"] == api["completion_tokens"] == 2 * 4
    assert engine["finish_reasons"] == api["finish_reasons"] == {"length": 2}
    # The same prompts, token for token; the warm-up cached the system prompt on both sides.
    assert report["prompt_tokens_match"], (engine["prompt_tokens"], api["prompt_tokens"])
    assert engine["cached_tokens_mean"] > 0 and api["cached_tokens_mean"] > 0
    for side in (engine, api):
        assert side["throughput_tok_s"] > 0
        assert 0 < side["ttft_p50_s"] <= side["ttft_p95_s"]
    assert report["ratio"] > 0 and isinstance(report["target_met"], bool)
    assert api["server_engine"]["requests"] == 3  # the warm-up and the 2 clients
    assert "api / engine" in bench.format_report(report)
