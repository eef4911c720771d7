"""KV pressure: many long requests against a KV cache that holds little more than one sequence.

Starts a real server whose active model configuration has `--max-model-len` (1024) and the
smallest KV budget the configuration's validation accepts for it (`ModelConfig.clean()`: one
`max_model_len` sequence must fit; `--kv-cache-mb` sets another). Then `--requests` streaming
`/v1/chat/completions` requests (unique ~`--prompt-words`-word prompts, greedy, `ignore_eos`,
`--max-tokens` each) are sent at once, so together they need many times the cache. The scheduler
must queue them and preempt running ones (by recompute) as decodes grow; nobody may see an error.
`/metrics` is polled while they run (peak running, waiting, KV usage).

Checks: the requests need at least twice the cache; every request completes without error, with a
full answer (finish reason `length`, exactly `--max-tokens` tokens); preemptions > 0 in
`/metrics`; no engine request ended in error or abort; the engine idle afterwards (nothing running
or waiting, KV usage 0); `/healthz` ok.

    python -m reliability.kv_pressure --json
    python -m reliability.kv_pressure --json --requests 8 --prompt-words 100 --max-tokens 64
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import CannotRunError, LiveServer, LiveServerError, default_models_dir
from reliability.common import (
    MAX_DETAILS,
    ApiReply,
    Common,
    api_chat,
    api_client,
    check,
    config_report,
    engine_state,
    healthz,
    run_suite,
    server_report,
    start_server,
    suite_parser,
    wait_for_idle,
)

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 900.0
IDLE_TIMEOUT_S = 60.0
POLL_S = 0.25
MIN_DEMAND_RATIO = 2.0
WORDS = (
    "harbour",
    "lantern",
    "copper",
    "meadow",
    "violet",
    "engine",
    "river",
    "signal",
    "orchard",
    "canyon",
    "marble",
    "pepper",
    "ticket",
    "glacier",
    "falcon",
    "ribbon",
    "cactus",
    "walnut",
    "thunder",
    "blanket",
    "compass",
    "saddle",
    "mirror",
    "cotton",
    "lemon",
    "anchor",
    "velvet",
    "pebble",
    "tunnel",
    "rocket",
    "garden",
    "bucket",
    "island",
    "candle",
    "feather",
    "helmet",
)


@dataclass(frozen=True, slots=True)
class Pressure:
    requests: int = 24
    prompt_words: int = 150
    max_tokens: int = 128
    max_model_len: int = 1024
    kv_cache_mb: int | None = None  # None: the smallest budget that holds one max-length sequence
    dtype: str = "auto"


def prompt_of(index: int, words: int, rng: random.Random) -> str:
    """A unique prompt: an instruction and `words` random words (no two requests share blocks)."""
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Request {index}. Continue this list of words for as long as you can: {body}"


async def monitor(server: LiveServer, stop: asyncio.Event, peaks: dict) -> None:
    """Poll `/metrics` until `stop`, keeping the peaks of running, waiting and KV usage."""
    while not stop.is_set():
        state = await asyncio.to_thread(engine_state, server)
        if state is not None:
            peaks["running"] = max(peaks["running"], state.running)
            peaks["waiting"] = max(peaks["waiting"], state.waiting)
            peaks["kv_usage"] = max(peaks["kv_usage"], state.kv_usage)
            peaks["samples"] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)


async def drive(server: LiveServer, site: dict, pressure: Pressure, seed: int) -> dict:
    rng = random.Random(seed)
    prompts = [prompt_of(i, pressure.prompt_words, rng) for i in range(pressure.requests)]
    params = {"temperature": 0, "max_tokens": pressure.max_tokens, "ignore_eos": True}
    peaks = {"running": 0, "waiting": 0, "kv_usage": 0.0, "samples": 0}
    async with api_client(server, site["api_key"], REQUEST_TIMEOUT_S) as client:
        stop = asyncio.Event()
        watcher = asyncio.create_task(monitor(server, stop, peaks))
        began = time.perf_counter()
        replies: list[ApiReply] = list(
            await asyncio.gather(
                *(
                    api_chat(
                        client,
                        site["model"],
                        [{"role": "user", "content": prompt}],
                        stream=True,
                        **params,
                    )
                    for prompt in prompts
                )
            )
        )
        wall_s = time.perf_counter() - began
        stop.set()
        await watcher
    return {"replies": replies, "wall_s": wall_s, "peaks": peaks}


def run_pressure(pressure: Pressure, common: Common | None = None) -> dict:
    common = common or Common()
    if min(pressure.requests, pressure.prompt_words, pressure.max_tokens) < 1:
        raise ValueError("requests, prompt words and max_tokens must be at least 1")
    models_dir = Path(common.models_dir) if common.models_dir else default_models_dir()
    spec = {
        "model_config": {
            "dtype": pressure.dtype,
            "max_model_len": pressure.max_model_len,
            "kv_cache_mb": pressure.kv_cache_mb or "min",
        },
        "users": 1,
    }
    began = time.perf_counter()
    try:
        with LiveServer(
            models_dir=models_dir,
            torch_threads=common.torch_threads,
            ready_timeout_s=common.startup_timeout_s,
        ) as server:
            site = start_server(server, spec)
            before = engine_state(server)
            if before is None:
                raise CannotRunError("could not read /metrics")
            result = asyncio.run(drive(server, site, pressure, common.seed))
            after, waited_s = wait_for_idle(server, IDLE_TIMEOUT_S)
            health = healthz(server)
            log_tail = server.log_tail()
    except LiveServerError as error:
        raise CannotRunError(str(error)) from None
    report = build_report(pressure, common, site, result, before, after, waited_s, health)
    report["wall_s"] = round(time.perf_counter() - began, 1)
    if any(not item["ok"] for item in report["checks"]):
        logger.warning("checks failed; the server's log ends:\n%s", log_tail)
    return report


def build_report(pressure, common, site, result, before, after, waited_s, health) -> dict:
    replies: list[ApiReply] = result["replies"]
    errors = [(i, r) for i, r in enumerate(replies) if r.error is not None]
    answered = [r for r in replies if r.error is None]
    short = [
        {"request": i, "finish_reason": r.finish_reason, "completion_tokens": r.completion_tokens}
        for i, r in enumerate(replies)
        if r.error is None
        and not (
            r.finish_reason == "length" and r.completion_tokens == pressure.max_tokens and r.text
        )
    ]
    demand = sum((r.prompt_tokens or 0) + pressure.max_tokens for r in answered)
    if len(answered) < len(replies):  # errors have no usage: estimate them as the mean
        mean = demand / len(answered) if answered else 0
        demand += mean * (len(replies) - len(answered))
    ratio = demand / site["kv_tokens"] if site["kv_tokens"] else 0.0
    finished_before, finished_after = before.finished, (after.finished if after else {})
    delta = {
        reason: finished_after.get(reason, 0) - finished_before.get(reason, 0)
        for reason in finished_after
    }
    preemptions = (after.preemptions if after else 0) - before.preemptions
    checks = [
        check(
            f"the requests need at least {MIN_DEMAND_RATIO:.0f}x the KV cache",
            ratio >= MIN_DEMAND_RATIO,
            demand_tokens=int(demand),
            kv_cache_tokens=site["kv_tokens"],
            ratio=round(ratio, 2),
        ),
        check(
            "every request completed without error",
            not errors,
            requests=len(replies),
            errors=len(errors),
            details=[{"request": i, **r.error} for i, r in errors[:MAX_DETAILS]],
        ),
        check(
            f"every answer is full (finish reason length, {pressure.max_tokens} tokens)",
            not errors and not short,
            short=short[:MAX_DETAILS],
        ),
        check("requests were preempted (/metrics)", preemptions > 0, preemptions=preemptions),
        check(
            "no engine request ended in error or abort",
            delta.get("error", 0) == 0 and delta.get("abort", 0) == 0,
            finished_by_reason=delta,
        ),
        check(
            "engine idle afterwards (nothing running or waiting, KV usage 0)",
            after is not None and after.is_idle,
            engine=after.as_json() if after else None,
            waited_s=waited_s,
        ),
        check("/healthz ok afterwards", health == "ok", status=health),
    ]
    tokens = sum(r.completion_tokens or 0 for r in answered)
    return {
        "config": config_report(pressure, common),
        "server": server_report(site, "kv_blocks"),
        "requests": len(replies),
        "answered": len(answered),
        "prompt_tokens_mean": round(
            sum(r.prompt_tokens or 0 for r in answered) / max(len(answered), 1), 1
        ),
        "completion_tokens": tokens,
        "demand_ratio": round(ratio, 2),
        "preemptions": preemptions,
        "peaks": result["peaks"],
        "run_s": round(result["wall_s"], 2),
        "output_tok_s": round(tokens / result["wall_s"], 2) if result["wall_s"] > 0 else None,
        "engine_after": after.as_json() if after else None,
        "checks": checks,
    }


def summary(report: dict) -> list[str]:
    config, server = report["config"], report["server"]
    return [
        f"{config['requests']} requests x (~{report['prompt_tokens_mean']:.0f} prompt + "
        f"{config['max_tokens']} tokens) against {server['kv_tokens']} KV tokens "
        f"({server['model_config']['kv_cache_mb']} MB, {server['model_config']['dtype']}): "
        f"{report['demand_ratio']}x the cache",
        f"answered {report['answered']}/{report['requests']} in {report['run_s']} s, "
        f"{report['preemptions']} preemptions, peaks {report['peaks']}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = suite_parser("kv_pressure", __doc__)
    parser.add_argument("--requests", type=int, default=24, help="concurrent requests (24)")
    parser.add_argument("--prompt-words", type=int, default=150, help="words a prompt (150)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens an answer (128)")
    parser.add_argument("--max-model-len", type=int, default=1024, help="context (1024)")
    parser.add_argument(
        "--kv-cache-mb", type=int, help="KV budget (default: the smallest the config accepts)"
    )
    parser.add_argument("--dtype", default="auto", help="the model's dtype (auto)")
    args = parser.parse_args(argv)
    pressure = Pressure(
        requests=args.requests,
        prompt_words=args.prompt_words,
        max_tokens=args.max_tokens,
        max_model_len=args.max_model_len,
        kv_cache_mb=args.kv_cache_mb,
        dtype=args.dtype,
    )
    return run_suite(args, run_pressure, pressure, summary)


if __name__ == "__main__":
    sys.exit(main())
