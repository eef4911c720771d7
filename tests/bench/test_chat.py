"""bench.chat at smoke sizes: a real daphne server, real WebSocket chats, the whole report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import chat as bench

pytestmark = pytest.mark.real_weights


def test_a_smoke_run_chats_over_the_real_stack_and_reports_every_turn(chat_model_dir) -> None:
    # NOTE: one passage per turn keeps the prompts short; the models cache is the suite's own.
    report = bench.run_bench(
        chats=2, turns=3, max_tokens=4, top_k=1, models_dir=Path(chat_model_dir).parent
    )
    json.dumps(report)
    assert report["errors"] == 0, report["error_details"]
    assert report["config"]["chats"] == 2 and report["config"]["document_chunks"] > 0
    assert report["config"]["model"]
    assert set(report["turns"]) == {"1", "2", "3"}
    for turn in report["turns"].values():
        assert turn["answers"] == 2
        assert 0 < turn["ttft_p50_s"] <= turn["ttft_p95_s"]
        assert turn["server_ttft_p50_s"] > 0
        assert turn["completion_tokens_mean"] == 4
        assert turn["sources_mean"] == 1
    # Later turns reuse the earlier turns' tokens from the prefix cache, over the real server.
    assert report["turns"]["2"]["cached_share"] > 0.5
    assert report["turns"]["2"]["prompt_tokens_mean"] > report["turns"]["1"]["prompt_tokens_mean"]
    assert set(report) >= {"turn2_ttft_ratio", "turn3_ttft_ratio", "output_tok_s", "targets"}
    assert set(report["targets"]) == {
        "ttft_p50_le_half_of_turn1",
        "cached_share_ge_0_8_from_turn2",
    }
    assert report["server"]["engine"]["requests"] == 7  # the warm-up and 2 x 3 turns
    assert "turn" in bench.format_report(report)


def test_every_chat_opens_with_its_own_question() -> None:
    # The first question differs per chat, so every later prompt of a chat is unique too.
    first = [bench.question(chat, 1) for chat in range(20)]
    assert len(set(first)) == len(first)
    assert "chat 3" in bench.question(2, 1)
    assert bench.question(0, 2) != bench.question(0, 3)
