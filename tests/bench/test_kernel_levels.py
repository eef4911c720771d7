"""bench.kernel_levels: its smoke run on the real bundled model, PyTorch against every level."""

from __future__ import annotations

import json

import pytest

from bench.kernel_levels import BASELINE, format_table, main
from inference.engine.kernels import supported_isa_levels


@pytest.mark.real_weights
def test_the_smoke_table_has_pytorch_and_this_cpus_best_level_with_its_ratio(
    settings, capsys
) -> None:
    status = main(["--smoke", "--json", "--models-dir", str(settings.MODELS_DIR)])
    assert status == 0
    report = json.loads(capsys.readouterr().out)

    levels = [level.name for level in supported_isa_levels()]
    assert report["config"]["levels"] == levels
    rows = report["results"]
    assert [row["kernels"] for row in rows] == [BASELINE, *levels[:1]]
    baseline, *native = rows
    assert not baseline["fused_decode"] and baseline["decode_tok_s"] > 0
    for row in native:  # each level really ran its kernels: the decode step fused
        assert row["model"] == "smollm2-135m-instruct" and row["fused_decode"]
        assert row["decode_tok_s_over_pytorch"] == pytest.approx(
            row["decode_tok_s"] / baseline["decode_tok_s"], abs=0.01
        )
    table = format_table(report)
    assert f"| smollm2-135m-instruct | {BASELINE} | " in table
    for level in levels[:1]:
        assert f"| smollm2-135m-instruct | {level} | " in table


def test_a_failed_configuration_keeps_its_row_with_the_reason():
    report = {
        "config": {
            "cpu": "a CPU",
            "levels": ["avx2"],
            "quantization": "auto",
            "workload": {"concurrency": [2]},
        },
        "results": [
            {"model": "m", "kernels": BASELINE, "error": "out of memory"},
            {"model": "m", "kernels": "avx2", "dtype": "float32", "fused_decode": True,
             "decode_tok_s": 10.0, "concurrent_tok_s": 12.0, "cold_ttft_s": 0.5},
        ],
    }  # fmt: skip
    table = format_table(report)
    assert "| m | pytorch | failed: out of memory |" in table
    assert "| m | avx2 | float32 | yes | 10.0 | 12.0 | 0.50 |" in table


def test_a_level_this_cpu_cannot_run_is_refused_before_any_model_loads(caplog):
    status = main(["--levels", "pytorch,no_such_level", "--model", "smollm2-135m-instruct"])
    assert status == 2  # could not run
    assert "not a level this CPU runs: no_such_level" in caplog.text
