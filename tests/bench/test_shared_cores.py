"""bench.shared_cores: its smoke run, the real engine next to a real ingestion process."""

from __future__ import annotations

import json

import pytest

from bench.shared_cores import format_table, main


@pytest.mark.real_weights
def test_the_smoke_run_measures_the_chat_idle_and_next_to_an_ingestion(settings, capsys) -> None:
    status = main(["--smoke", "--json", "--models-dir", str(settings.MODELS_DIR)])
    assert status == 0
    report = json.loads(capsys.readouterr().out)

    idle, shared = report["results"]
    assert (idle["threads"], idle["neighbour"]) == ("adaptive", "none")
    assert (shared["threads"], shared["neighbour"]) == ("adaptive", "ingestion")
    assert idle["neighbour_alone_per_s"] is None
    for row in (idle, shared):
        assert row["decode_tok_s"] > 0 and row["concurrent_tok_s"] > 0
        assert 1 <= row["threads_at_end"] <= row["max_threads"]
    # the neighbour really embedded passages before the chat started
    assert shared["neighbour_alone_per_s"] > 0
    assert shared["decode_tok_s_of_idle"] == pytest.approx(
        shared["decode_tok_s"] / idle["decode_tok_s"], abs=1e-3
    )
    table = format_table(report)
    assert "| adaptive | ingestion | " in table
    assert f"{shared['neighbour_alone_per_s']} -> " in table


def test_a_failed_configuration_keeps_its_row_with_the_reason() -> None:
    report = {
        "config": {"cpu": "a CPU", "cores": 2, "model": "m", "workload": {"concurrency": [8]}},
        "results": [{"threads": "fixed", "neighbour": "busy", "error": "it died"}],
    }
    assert "| fixed | busy | error: it died |" in format_table(report)
