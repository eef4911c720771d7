"""bench.engine at smoke sizes: the harness runs end to end and reports every figure."""

from __future__ import annotations

import json

import pytest

from bench import engine as bench

pytestmark = pytest.mark.real_weights


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


def test_the_smoke_optimization_table_measures_every_row_and_writes_markdown_json_and_a_chart(
    chat_model_dir, tmp_path, capsys
) -> None:
    from bench.optimization_table import ROWS

    out, chart = tmp_path / "benchmarks.md", tmp_path / "charts" / "benchmarks.png"
    argv = ["--table", "--smoke", "--model-dir", str(chat_model_dir)]
    table = bench.main([*argv, "--out", str(out), "--chart", str(chart)])
    assert json.loads(capsys.readouterr().out) == table
    rows = table["rows"]
    assert [row["name"] for row in rows] == [row.name for row in ROWS]
    for row in rows:
        assert row["ttft_p50_s"] > 0 and row["single_tok_s"] > 0 and row["throughput_tok_s"] > 0
        assert row["kv_peak_mb"] > 0 and 1 < row["perplexity"] < 100
        assert 0 <= row["answer_f1"] <= 1  # gold-passage F1 (bench.answer_quality)
    by_name = {row["name"]: row for row in rows}
    bf16 = by_name["+ continuous batching"]
    assert by_name["+ int8 weights"]["weights_mb"] < 0.6 * bf16["weights_mb"]
    assert by_name["+ int4 weights"]["weights_mb"] < by_name["+ int8 weights"]["weights_mb"]
    assert bf16["perplexity_change"] == 0.0  # the reference format
    # Greedy answers depend on the weight/KV format only: rows sharing one share the F1.
    assert by_name["+ speculative decoding"]["answer_f1"] == bf16["answer_f1"]
    speculative = table["speculative_extractive"]
    assert speculative["identical_text"] and speculative["acceptance_rate"] > 0
    markdown = out.read_text()
    assert markdown.count("\n| ") == len(ROWS) + 1  # header + one line per row
    assert "![optimization chart](charts/benchmarks.png)" in markdown
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The staff dashboard reads the run from the JSON beside the markdown.
    written = json.loads(out.with_suffix(".json").read_text())
    assert written["rows"] == rows and written["chart"] == "charts/benchmarks.png"
    assert written["command"] and written["measured_at"]
