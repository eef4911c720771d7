"""bench.catalogue: its smoke run on the real bundled model, each figure from a real engine."""

from __future__ import annotations

import json

import pytest

from bench.catalogue import SMOKE_QUESTIONS, format_table, main
from bench.squad_questions import DEFAULT_SQUAD_DIR

pytestmark = pytest.mark.skipif(
    not DEFAULT_SQUAD_DIR.is_dir(), reason=f"the squad-dev set is not at {DEFAULT_SQUAD_DIR}"
)


@pytest.mark.real_weights
@pytest.mark.django_db
def test_the_smoke_table_has_load_speed_and_answer_figures_for_the_bundled_model(
    settings, tmp_path, capsys
) -> None:
    settings.MEDIA_ROOT = tmp_path / "media"  # the end-to-end index's uploaded passages
    status = main(["--smoke", "--json", "--models-dir", str(settings.MODELS_DIR)])
    assert status == 0
    report = json.loads(capsys.readouterr().out)

    assert report["config"]["questions"] == report["config"]["e2e_questions"] == SMOKE_QUESTIONS
    [row] = report["results"]
    assert row["model"] == "smollm2-135m-instruct"
    # Served as the checkpoint is: a Q4_1 GGUF stays 4-bit (its float tables aside).
    assert row["checkpoint"] == "gguf" and "int4" in row["formats"]
    assert 0.5 < row["weight_ratio"] < 1.5
    assert row["weights_mb"] == pytest.approx(row["checkpoint_mb"] * row["weight_ratio"], rel=0.01)
    assert row["load_s"] > 0 and row["load_peak_rss_mb"] > row["weights_mb"]
    assert row["decode_tok_s"] > 0 and row["concurrent_tok_s"] > 0
    assert 0 <= row["gold_f1"] <= 1 and 0 <= row["e2e_f1"] <= 1

    [line] = [line for line in format_table(report).splitlines() if line.startswith("| smollm2")]
    assert line.startswith("| smollm2-135m-instruct | gguf as ")
    assert f"| {row['gold_f1']:.3f} | {row['e2e_f1']:.3f} |" in line


REPORT_CONFIG = {
    "cpu": "a CPU",
    "questions": 5,
    "e2e_questions": 5,
    "gold_retrieved": 1.0,
    "retrieval": {"passages": 10, "top_k": 5},
    "workload": {"system_tokens": 8, "user_tokens": 4, "output_tokens": 2, "concurrency": 16},
}


def test_a_base_model_gets_no_f1_in_the_table() -> None:
    report = {
        "config": REPORT_CONFIG,
        "results": [
            {
                "model": "gemma-3-270m",
                "checkpoint": "gguf",
                "formats": {"int4": 10, "int8": 3},
                "weights_mb": 230.0,
                "weight_ratio": 1.1,
                "load_s": 3.0,
                "load_peak_rss_mb": 600,
                "decode_tok_s": 50.0,
                "concurrent_tok_s": 200.0,
                "gold_f1": None,
                "e2e_f1": None,
            }
        ],
    }
    [line] = [line for line in format_table(report).splitlines() if line.startswith("| gemma")]
    assert line == (
        "| gemma-3-270m | gguf as int4 + int8 | 230 (1.10x) | 3.0 | 600 | 50.0 | 200.0 | "
        "n/a (base model) | n/a (base model) |"
    )


def test_a_model_that_could_not_be_measured_keeps_its_row_with_the_reason() -> None:
    report = {
        "config": REPORT_CONFIG,
        "results": [{"model": "broken", "error": "ValueError: the file is truncated"}],
    }
    [line] = [line for line in format_table(report).splitlines() if line.startswith("| broken")]
    assert line == "| broken | failed: ValueError: the file is truncated |" + " |" * 7
