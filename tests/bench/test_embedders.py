"""bench.embedders at smoke size: every packaged model measured on both sets beside a baseline."""

from __future__ import annotations

import json

import pytest

from bench import embedders as bench


def test_the_smoke_benchmark_measures_each_model_on_each_set_against_the_first(capsys) -> None:
    status = bench.main(["--json", "--smoke"])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["baseline"] == "all-MiniLM-L6-v2"
    pairs = {(row["model"], row["set"]) for row in report["rows"]}
    assert pairs == {
        (model, name)
        for model in ("all-MiniLM-L6-v2", "multilingual-e5-small")
        for name in ("squad-dev (en)", "debian-reference-zh")
    }
    for row in report["rows"]:
        assert row["passages_per_s"] > 0 and row["query_p50_ms"] > 0
        assert row["query_p95_ms"] >= row["query_p50_ms"]
        if row["model"] == report["baseline"]:
            assert row["passages_ratio"] == 1.0 and row["query_p50_ratio"] == 1.0
    # Each model counts with its own tokenizer: MiniLM's splits Chinese into more pieces.
    per_passage = {(r["model"], r["set"]): r["tokens_per_passage"] for r in report["rows"]}
    zh = "debian-reference-zh"
    assert per_passage[("all-MiniLM-L6-v2", zh)] != per_passage[("multilingual-e5-small", zh)]
    assert "| multilingual-e5-small | debian-reference-zh |" in bench.format_table(report)


def test_an_unknown_model_is_refused_with_exit_status_two() -> None:
    assert bench.main(["--smoke", "--model", "./no-such-model"]) == 2


@pytest.mark.parametrize("missing", ["--squad", "--chinese"])
def test_a_missing_set_is_refused_with_exit_status_two(missing, tmp_path) -> None:
    assert bench.main(["--smoke", missing, str(tmp_path)]) == 2
