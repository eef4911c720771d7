"""bench.replica_routing at smoke sizes: two real replicas behind a real front server per mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import replica_routing as bench
from harness import TurnResult

pytestmark = pytest.mark.real_weights


def test_a_smoke_run_routes_rag_chats_to_the_replicas_in_both_modes_side_by_side(
    chat_model_dir,
) -> None:
    report = bench.run_bench(
        chats=2, turns=2, max_tokens=4, top_k=1, models_dir=Path(chat_model_dir).parent
    )
    json.dumps(report)
    assert report["errors"] == 0, report
    assert list(report["modes"]) == ["random", "prefix"]
    for mode in report["modes"].values():
        # Every turn reached a replica (none fell back to the front's own engine).
        assert mode["routes"] == {"profile": 4}
        assert set(mode["answers_by_replica"]) <= {"replica-1", "replica-2"}
        assert mode["document_chunks"] > 0
        for turn in mode["turns"].values():
            assert turn["answers"] == 2 and turn["ttft_p50_s"] > 0 and turn["sources_mean"] == 1
    # Prefix routing sends the second turn where the first went, and finds its prompt cached.
    prefix = report["modes"]["prefix"]
    assert prefix["same_replica_share"] == {"2": 1.0}
    assert prefix["turns"]["2"]["cached_share"] > 0.5
    table = bench.format_report(report)
    assert "random" in table and "prefix" in table and "same replica" in table


def result(chat: int, turn: int, backend: str) -> TurnResult:
    return TurnResult(chat, turn, stats={"backend": backend})


def test_the_same_replica_share_compares_each_later_turn_with_its_chats_first() -> None:
    results = [
        result(0, 1, "a"),
        result(0, 2, "a"),
        result(0, 3, "b"),
        result(1, 1, "b"),
        result(1, 2, "b"),
        result(1, 3, "b"),
        TurnResult(2, 1),  # failed: no stats, its chat does not count
        result(2, 2, "a"),
    ]
    assert bench.same_replica_shares(results, 3) == {"2": 1.0, "3": 0.5}
