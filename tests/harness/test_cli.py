"""run_cli: the exit status and output of every benchmark command."""

from __future__ import annotations

import json

from harness import CannotRunError, run_cli


def report_with(*rows: dict) -> dict:
    return {"config": {}, "results": list(rows)}


def test_a_report_prints_as_json_or_a_table_and_rows_with_errors_make_it_exit_1(capsys):
    clean = report_with({"speed": 1.0})
    assert run_cli(lambda: clean, as_json=True, format_report=str) == 0
    assert json.loads(capsys.readouterr().out) == clean
    failed = report_with({"speed": 1.0}, {"error": "out of memory"})
    assert run_cli(lambda: failed, as_json=False, format_report=lambda r: "TABLE") == 1
    assert capsys.readouterr().out == "TABLE\n"


def test_a_command_that_cannot_run_exits_2_with_its_reason(caplog):
    def cannot() -> dict:
        raise CannotRunError("no model here")

    assert run_cli(cannot, as_json=True, format_report=str) == 2
    assert "no model here" in caplog.text
