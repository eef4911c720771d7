"""bench.prefill_weights: its smoke run on the real bundled model's quantized layers."""

from __future__ import annotations

import json

import pytest

from bench.prefill_weights import format_table, main

pytestmark = pytest.mark.real_weights


def test_the_smoke_run_times_both_weight_forms_on_both_steps(settings, capsys) -> None:
    assert main(["--smoke", "--json", "--models-dir", str(settings.MODELS_DIR)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == 64 and report["scattered_tokens"] == 16
    assert set(report["seconds"]) == {
        f"{case}/{weights}"
        for case in ("prefill", "scattered")
        for weights in ("quantized", "dense")
    }
    assert all(value > 0 for value in report["seconds"].values())
    assert report["dense_gib"] > 0 and set(report["speedup"]) == {"prefill", "scattered"}
    assert "| scattered |" in format_table(report)
