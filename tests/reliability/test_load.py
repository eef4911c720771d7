"""reliability.load: concurrent chats and API clients over rounds, twins, memory, engine idle.

The slow test runs the suite at a reduced size against a real server and asserts every check it
computes; the others feed the report made-up results to show each check can fail.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from reliability import load
from reliability.common import Common, EngineState

IDLE = EngineState(running=0, waiting=0, kv_usage=0.0, preemptions=0, finished={"stop": 4})
SITE = {"model": "m", "model_config": {"dtype": "float32"}, "kv_tokens": 1000, "startup_s": 1.0}


@pytest.mark.real_weights
def test_a_reduced_load_run_passes_every_check(chat_model_dir) -> None:
    # NOTE: sampled answers (the suite's default, temperature 0.8), every one twinned: the
    # Gumbel-max sampler keeps a seeded answer whatever shares its batch (docs/reliability.md).
    config = load.Load(chats=4, api_clients=4, rounds=2, duration_s=10.0, max_tokens=16, twins=None)
    # NOTE: one torch thread keeps the server quick on cores shared with other work.
    common = Common(models_dir=Path(chat_model_dir).parent, torch_threads=1)
    report = load.run_load(config, common)
    json.dumps(report)
    failed = [item for item in report["checks"] if not item["ok"]]
    assert not failed, failed
    assert len(report["checks"]) == 9
    assert report["server"]["model_config"]["dtype"] == "float32"
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    assert all(r["clients_answered"] == 8 for r in report["rounds"])
    assert report["chat_answers"] >= 8 and report["api_answers"] >= 8
    twins = next(item for item in report["checks"] if item["name"].startswith("every twin"))
    # --twins all: every API answer and the last answer of every conversation.
    assert twins["checked"] == sum(twins["candidates"].values()) >= 8
    assert twins["checked_api"] >= 4 and twins["checked_chat"] >= 4
    assert report["engine_at_end"]["running"] == 0 and report["engine_at_end"]["kv_usage"] == 0


def record(kind: str, **fields) -> load.Record:
    defaults = {"round": 1, "client": 0, "iteration": 0, "seed": 1, "prompt": "q", "text": "a",
                "finish_reason": "stop", "completion_tokens": 3}  # fmt: skip
    if kind == "chat":
        defaults |= {"saved": "a", "conversation": 1, "turn": 1}
    return load.Record(kind, **(defaults | fields))


def result(records, twins, rss=(1000.0, 1000.0), engine=IDLE, answered=2) -> dict:
    rounds = [
        {"round": n, "rss_mb": value, "clients_answered": answered, "engine": engine.as_json()}
        for n, value in enumerate(rss, start=1)
    ]
    return {
        "records": records,
        "rounds": rounds,
        "twins": twins,
        "twins_s": 1.0,
        "baseline": {"rss_mb": 990.0},
        "twin_candidates": {"api": 1, "chat": 1},
    }


def checks_of(report: dict) -> dict[str, bool]:
    return {item["name"].split(" (")[0].split(":")[0]: item["ok"] for item in report["checks"]}


def build(res: dict, final: EngineState = IDLE) -> dict:
    config = load.Load(chats=1, api_clients=1, rounds=len(res["rounds"]))
    return load.build_report(config, Common(), SITE, res, final, 0.0, 1000.0)


def test_the_report_passes_clean_results() -> None:
    twins = [{"kind": "api", "same": True}, {"kind": "chat", "same": True}]
    report = build(result([record("api"), record("chat", client=0)], twins))
    assert all(checks_of(report).values()), report["checks"]


def test_each_check_can_fail() -> None:
    records = [
        record("api", error={"type": "APIError", "message": "boom"}),
        record("chat", saved="a different saved answer", finish_reason="stopped"),
    ]
    twins = [{"kind": "api", "same": False, "at": 0}, {"kind": "chat", "same": True}]
    busy = EngineState(running=1, waiting=2, kv_usage=0.5, preemptions=0,
                       finished={"stop": 1, "abort": 1})  # fmt: skip
    res = result(records, twins, rss=(1000.0, 1200.0), engine=busy, answered=1)
    report = build(res, final=busy)
    checks = checks_of(report)
    assert not checks["no errors"]
    assert not checks["every client answered in every round"]
    assert not checks["every answer ended normally"]
    assert not checks["every chat answer was saved exactly as streamed"]
    assert not checks["every twin"]
    assert not checks["resident memory flat"]
    assert not checks["no engine request ended in error or abort"]
    assert not checks["engine idle after every round"]
    assert not checks["engine idle after the run"]
    memory = next(i for i in report["checks"] if i["name"].startswith("resident memory"))
    assert memory["growth_mb"] == 200.0 and memory["allowed_mb"] == 100.0


def test_rss_growth_within_ten_percent_passes() -> None:
    twins = [{"kind": "api", "same": True}]
    report = build(result([record("api"), record("chat")], twins, rss=(2000.0, 2150.0, 2190.0)))
    assert checks_of(report)["resident memory flat"]


def test_twins_come_from_api_answers_and_the_last_answer_of_each_conversation() -> None:
    records = [
        record("api", seed=1),
        record("api", seed=2, error={"type": "x"}),
        record("chat", conversation=5, turn=1, seed=3),
        record("chat", conversation=5, turn=2, seed=4),
        record("chat", conversation=6, turn=1, seed=5),
        record("chat", conversation=7, turn=1, seed=6),
        record("chat", conversation=7, turn=2, seed=7, error={"code": "engine_error"}),
    ]
    api, chat = load.twin_candidates(records)
    assert [r.seed for r in api] == [1]
    assert sorted(r.seed for r in chat) == [4, 5]  # conversation 7 had a failed turn
    sample = load.sample_twins(api, chat, 2, random.Random(0))
    assert sorted(r.kind for r in sample) == ["api", "chat"]
    assert load.sample_twins(api, chat, None, random.Random(0)) == api + chat


def test_seeds_differ_per_request() -> None:
    seeds = {
        load.seed_of(0, kind, round_no, client, iteration)
        for kind in ("chat", "api")
        for round_no in (1, 2, 3)
        for client in range(64)
        for iteration in range(50)
    }
    assert len(seeds) == 2 * 3 * 64 * 50
