"""bench.speculative at smoke size: every method measured in its own process, on every prompt."""

from __future__ import annotations

import json

import pytest

from bench import speculative as bench

pytestmark = pytest.mark.real_weights


def test_the_smoke_benchmark_reports_speed_and_acceptance_for_every_method_and_prompt(
    chat_model_dir, settings, capsys
) -> None:
    status = bench.main(["--json", "--smoke", "--models-dir", str(settings.MODELS_DIR)])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == report["draft"] == "smollm2-135m-instruct"
    assert [row["label"] for row in report["rows"]] == ["none", "ngram k=5", "draft k=4"]
    for row in report["rows"]:
        assert set(row["prompts"]) == set(bench.PROMPTS)
        for result in row["prompts"].values():
            assert result["tok_s"] > 0 and result["speedup"] > 0
            assert result["completion_tokens"] <= bench.SMOKE_MAX_TOKENS
    plain = report["rows"][0]["prompts"]
    assert all(result["acceptance"] is None for result in plain.values())
    for row in report["rows"][2:]:
        # The model drafting for itself: nearly every draft is accepted, and the answers are
        # plain decoding's (verifications run as decodes on the fused path).
        code = row["prompts"]["code"]
        assert code["acceptance"] > 0.8
        assert code["same_answer"]
    assert "| draft k=4 | code |" in bench.format_table(report)
