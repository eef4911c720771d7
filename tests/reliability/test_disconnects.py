"""reliability.disconnects: clients that go away at random points must leak nothing.

The slow test runs the suite at a reduced size against a real server and asserts every check it
computes; the others check the seeded plan and feed the report made-up results to show each check
can fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reliability import disconnects
from reliability.common import Common, EngineState

SITE = {"model": "m", "model_config": {}, "kv_tokens": 1000, "startup_s": 1.0}


@pytest.mark.real_weights
def test_twenty_clients_disconnecting_at_random_leave_the_engine_idle(chat_model_dir) -> None:
    config = disconnects.Disconnects(clients=20, spread_s=3.0)
    common = Common(models_dir=Path(chat_model_dir).parent, torch_threads=1)
    report = disconnects.run_disconnects(config, common)
    json.dumps(report)
    failed = [item for item in report["checks"] if not item["ok"]]
    assert not failed, failed
    assert report["clients"] == 20 and report["api_clients"] and report["chat_clients"]
    assert report["engine_after"]["kv_usage"] == 0 and report["engine_after"]["running"] == 0


def test_the_plan_is_seeded_and_mixes_kinds_points_and_closes() -> None:
    config = disconnects.Disconnects(clients=100)
    plans = disconnects.make_plans(config, seed=3)
    assert plans == disconnects.make_plans(config, seed=3)
    assert plans != disconnects.make_plans(config, seed=4)
    assert {p.kind for p in plans} == {"api", "chat"}
    assert {(p.kind, p.point) for p in plans} == {
        (kind, point) for kind in ("api", "chat") for point in disconnects.POINTS
    }
    assert 20 < sum(p.abrupt for p in plans) < 80
    assert all(1 <= p.after_chunks <= config.max_tokens // 3 for p in plans)
    assert all(0 <= p.delay_s <= config.spread_s for p in plans)


def outcome(point: str, **fields) -> disconnects.Outcome:
    plan = disconnects.Plan(0, "api", point, 3, False, 0.0, 0.0, 1)
    return disconnects.Outcome(plan, **fields)


def normal(ok: bool) -> dict:
    return {"api": {"ok": ok}, "chat": {"ok": True}}


def test_each_check_can_fail() -> None:
    before = EngineState(running=0, waiting=0, kv_usage=0.0, preemptions=0, finished={})
    leaked = EngineState(running=1, waiting=1, kv_usage=0.2, preemptions=0,
                         finished={"stop": 2, "error": 1})  # fmt: skip
    result = {
        "outcomes": [outcome("mid_stream", ended=True), outcome("early", error={"code": "x"})],
        "storm_s": 1.0,
        "after": leaked,
        "waited_s": 60.0,
        "normal": normal(False),
    }
    config = disconnects.Disconnects(clients=2)
    report = disconnects.build_report(config, Common(), SITE, result, before, leaked, "error", True)
    assert [item["ok"] for item in report["checks"]] == [False] * 6, report["checks"]

    idle = EngineState(running=0, waiting=0, kv_usage=0.0, preemptions=0,
                       finished={"stop": 2, "abort": 1})  # fmt: skip
    result |= {
        "outcomes": [outcome("mid_stream", reached=True), outcome("early", reached=True)],
        "after": idle,
        "normal": normal(True),
    }
    report = disconnects.build_report(config, Common(), SITE, result, before, idle, "ok", True)
    assert all(item["ok"] for item in report["checks"]), report["checks"]
