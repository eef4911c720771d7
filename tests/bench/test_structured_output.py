"""bench.structured_output at smoke size: both decodings measured, every finished document valid."""

from __future__ import annotations

import json

import pytest

from bench import structured_output as bench

pytestmark = pytest.mark.real_weights


def test_the_smoke_benchmark_reports_both_speeds_their_ratio_and_valid_documents(
    chat_model_dir, settings, capsys
) -> None:
    status = bench.main(["--json", "--smoke", "--models-dir", str(settings.MODELS_DIR)])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "smollm2-135m-instruct"
    assert report["constrained_tok_s"] > 0 and report["free_tok_s"] > 0
    assert report["ratio"] == pytest.approx(
        report["constrained_tok_s"] / report["free_tok_s"], rel=0.01
    )
    assert report["batch_ratio"] > 0
    assert report["num_documents"] == bench.SMOKE_REPEATS + 1 + bench.SMOKE_BATCH // 2
    assert report["finished_all_valid"]
    assert report["cached_compile_ms"] < report["first_compile_ms"]
    assert report["sample"].lstrip().startswith("{")
    assert "| JSON Schema (single stream) |" in bench.format_table(report)
