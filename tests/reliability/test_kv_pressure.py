"""reliability.kv_pressure: long requests against a KV cache of about one sequence.

The slow test runs the suite at a reduced size against a real server and asserts every check it
computes; the other feeds the report made-up results to show each check can fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reliability import kv_pressure
from reliability.common import ApiReply, Common, EngineState

SITE = {
    "model": "m",
    "model_config": {"dtype": "auto", "kv_cache_mb": 23},
    "kv_blocks": 65,
    "kv_tokens": 1040,
    "startup_s": 1.0,
}


@pytest.mark.real_weights
def test_a_reduced_run_queues_and_preempts_and_completes_every_request(chat_model_dir) -> None:
    config = kv_pressure.Pressure(requests=12, prompt_words=100, max_tokens=64)
    common = Common(models_dir=Path(chat_model_dir).parent, torch_threads=1)
    report = kv_pressure.run_pressure(config, common)
    json.dumps(report)
    failed = [item for item in report["checks"] if not item["ok"]]
    assert not failed, failed
    assert report["answered"] == 12 and report["completion_tokens"] == 12 * 64
    assert report["preemptions"] > 0 and report["demand_ratio"] >= 2
    # The smallest budget the configuration accepts: one 1024-token sequence, rounded up to MB.
    assert 1024 <= report["server"]["kv_tokens"] < 1024 + 64
    assert report["peaks"]["kv_usage"] > 0.9


def test_each_check_can_fail() -> None:
    before = EngineState(running=0, waiting=0, kv_usage=0.0, preemptions=0, finished={})
    after = EngineState(running=1, waiting=0, kv_usage=0.1, preemptions=0,
                        finished={"length": 1, "error": 1})  # fmt: skip
    replies = [
        ApiReply(text="x", finish_reason="length", prompt_tokens=100, completion_tokens=64),
        ApiReply(text="x", finish_reason="stop", prompt_tokens=100, completion_tokens=10),
        ApiReply(error={"type": "APIError", "message": "boom"}),
    ]
    result = {"replies": replies, "wall_s": 1.0, "peaks": {}}
    config = kv_pressure.Pressure(requests=3, max_tokens=64)
    report = kv_pressure.build_report(config, Common(), SITE, result, before, after, 0.0, "error")
    assert [item["ok"] for item in report["checks"]] == [False] * 7, report["checks"]

    clean = [
        ApiReply(text="x", finish_reason="length", prompt_tokens=400, completion_tokens=64)
    ] * 8
    idle = EngineState(running=0, waiting=0, kv_usage=0.0, preemptions=3,
                       finished={"length": 8})  # fmt: skip
    result = {"replies": clean, "wall_s": 1.0, "peaks": {}}
    report = kv_pressure.build_report(config, Common(), SITE, result, before, idle, 0.0, "ok")
    assert all(item["ok"] for item in report["checks"]), report["checks"]


def test_prompts_are_unique_and_about_the_asked_length() -> None:
    import random

    rng = random.Random(0)
    prompts = [kv_pressure.prompt_of(i, 100, rng) for i in range(20)]
    assert len(set(prompts)) == 20
    assert all(100 <= len(p.split()) <= 115 for p in prompts)
