"""inference.bench at smoke sizes: the harness runs end to end and reports every figure."""

from __future__ import annotations

import json

import pytest

from inference import bench

pytestmark = pytest.mark.slow


def test_the_smoke_benchmark_prints_engine_and_hf_figures_with_ratios(
    chat_model_dir, capsys
) -> None:
    result = bench.main(["--json", "--smoke", "--model-dir", str(chat_model_dir)])
    printed = json.loads(capsys.readouterr().out)
    assert printed == result
    for side in ("engine", "hf"):
        figures = printed[side]
        assert figures["cold_ttft_s"] > 0
        assert figures["warm_ttft_s"] > 0
        assert figures["decode_tok_s"] > 0
        assert set(figures["throughput_tok_s"]) == {"1", "2"}
        assert figures["peak_rss_mb"] > 100
    # The warm request shares the system prompt with the cold one: the prefix cache serves it.
    assert printed["engine"]["warm_cached_tokens"] >= 32
    assert set(printed["ratios"]) == {
        "engine_warm_over_cold_ttft",
        "engine_over_hf_decode",
        "engine_over_hf_throughput_1",
        "engine_over_hf_throughput_2",
    }


def test_prompts_have_the_requested_shape(chat_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    workload = bench.Workload(system_tokens=100, user_tokens=30)
    first, second = bench.build_prompts(tokenizer, workload, 2, first_seed=1)
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert 100 <= shared <= 115  # the system turn (plus template tokens) is a common prefix
    assert 130 <= len(first) <= 150
    assert first != second
