"""REST API streaming benchmark: concurrent OpenAI clients against the engine's in-process figure.

The issue: "32 concurrent streaming API clients on the engine bench workload: aggregate output
tok/s within 15% of the engine's in-process figure (the web stack adds little)". One run measures
both sides on the same prompts, model and engine settings, one after the other:

1. engine: a throwaway server's data dir is prepared (`harness.live_server.LiveServer`), and the
   engine settings the server will use are read from it; an `Engine` is built in this process on
   them, and `--concurrency` requests run at once (`Engine.generate`) after one warm-up request.
   Then it is shut down, so its memory and cores are free for the server.
2. api: the server starts, and `--concurrency` `openai.AsyncOpenAI` clients stream
   `/v1/chat/completions` at once (greedy, `ignore_eos`, usage in the stream), after one warm-up
   request.

The workload is the engine bench's (`bench.workload`): a fixed ~1,000-token system prompt, a
unique ~250-token user turn per request, `--max-tokens` (64) output tokens. Both sides send the
same messages; the engine side builds their token ids with the server's own `PromptBuilder`, so
the prompts are the same tokens (checked: `prompt_tokens_match`). Aggregate output tok/s =
completion tokens / wall time from the first request to the last answer (`[DONE]` on the API
side). Reports TTFT p50/p95 (the API's client side: request sent -> first content chunk) and
per-stream decode tok/s too.

    python -m bench.api --json              # 32 clients x 64 tokens (a few minutes on 2 cores)
    python -m bench.api --json --smoke      # 2 clients x 4 tokens, short prompts
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.workload import SMOKE, Seeds, Workload, text_of_tokens
from harness import (
    SITE_TIMEOUT_S,
    CannotRunError,
    LiveServer,
    LiveServerError,
    counts,
    default_models_dir,
    rounded,
    run_cli,
)

logger = logging.getLogger(__name__)

TARGET_RATIO = 0.85  # API throughput at least 85% of the engine's: "within 15%"
SMOKE_CONCURRENCY, SMOKE_MAX_TOKENS = 2, 4
MAX_ERROR_DETAILS = 10
# What the bench asks `harness.site.prepare_site` for: an API key, and the engine settings the
# server will load (the in-process engine runs on them).
SITE_SPEC = {"label": "api-bench", "users": 0, "api_key": True, "engine_config": True}


# --- The workload ---


@dataclass(frozen=True, slots=True)
class Texts:
    """What both sides send: one system prompt, a warm-up user turn and one user turn a client."""

    system: str
    warmup: str
    users: list[str]


def workload_texts(tokenizer, workload: Workload, concurrency: int) -> Texts:
    seeds = Seeds()
    system = text_of_tokens(tokenizer, workload.system_tokens, seed=0)
    warmup = text_of_tokens(tokenizer, workload.user_tokens, seed=seeds.take(1))
    first = seeds.take(concurrency)
    users = [
        text_of_tokens(tokenizer, workload.user_tokens, seed=first + i) for i in range(concurrency)
    ]
    return Texts(system, warmup, users)


# --- The report's numbers ---


def _spread(values: list[float], key: str, digits: int = 4) -> dict:
    """p50 and p95 of `values`, under `key` with {} as the percentile (None without values)."""
    return {
        key.format(q): rounded(np.percentile(values, q), digits) if values else None
        for q in (50, 95)
    }


# --- (a) The engine in this process ---


def bench_engine(engine_config: dict, workload: Workload, concurrency: int) -> tuple[dict, Texts]:
    """The workload on an in-process `Engine`: one warm-up request, then all at once."""
    from inference.engine import Engine, EngineConfig, SamplingParams
    from inference.prompts import PromptBuilder

    began = time.perf_counter()
    engine = Engine(EngineConfig(**engine_config))
    load_s = time.perf_counter() - began
    try:
        texts = workload_texts(engine.tokenizer, workload, concurrency)
        # NOTE: the server builds chat prompts this way (chat.delta_sources.prompt_builder_for).
        builder = PromptBuilder(engine.tokenizer, texts.system, max_model_len=engine.max_model_len)

        def prompt(user: str) -> list[int]:
            return builder.build([], user, max_tokens=workload.output_tokens).token_ids

        params = SamplingParams(temperature=0, max_tokens=workload.output_tokens, ignore_eos=True)
        engine.generate([prompt(texts.warmup)], params)  # caches the system prompt, as (b) does
        prompts = [prompt(user) for user in texts.users]
        cpu_began, began = time.process_time(), time.perf_counter()
        results = engine.generate(prompts, params)
        wall_s = time.perf_counter() - began
        cpu_s = time.process_time() - cpu_began
    finally:
        engine.shutdown()
    usages = [r.usage for r in results]
    completion = sum(u.completion_tokens for u in usages)
    report = {
        "throughput_tok_s": rounded(completion / wall_s, 2),
        "wall_s": rounded(wall_s, 3),
        "requests": len(results),
        "completion_tokens": completion,
        "prompt_tokens": [u.prompt_tokens for u in usages],
        "prompt_tokens_mean": rounded(np.mean([u.prompt_tokens for u in usages]), 1),
        "cached_tokens_mean": rounded(np.mean([u.cached_tokens for u in usages]), 1),
        **_spread([u.ttft_s for u in usages if u.ttft_s is not None], "ttft_p{}_s"),
        **_spread([u.tokens_per_s for u in usages if u.tokens_per_s], "tokens_per_s_p{}", 2),
        "preemptions": sum(u.num_preemptions for u in usages),
        "finish_reasons": counts(r.finish_reason for r in results),
        "load_s": rounded(load_s, 2),
        "cpu_s": rounded(cpu_s, 2),
    }
    return report, texts


# --- (b) Streaming clients against the server ---


@dataclass(slots=True)
class StreamResult:
    index: int
    sent: float = 0.0  # perf_counter when the request went out
    ttft_s: float | None = None  # request sent -> first content chunk
    total_s: float | None = None  # request sent -> end of stream ([DONE])
    ended: float | None = None
    content_chunks: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: dict | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed after the first token, as the client saw it."""
        if not self.completion_tokens or self.completion_tokens < 2 or self.ttft_s is None:
            return None
        decode_s = self.total_s - self.ttft_s
        return (self.completion_tokens - 1) / decode_s if decode_s > 0 else None


async def stream_one(
    client, model: str, system: str, user: str, max_tokens: int, index: int
) -> StreamResult:
    """One streamed chat completion; errors end up in the result, not raised."""
    import openai

    result = StreamResult(index)
    result.sent = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            stream=True,
            stream_options={"include_usage": True},
            temperature=0,
            max_tokens=max_tokens,
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if chunk.choices:
                choice = chunk.choices[0]
                if choice.delta.content:
                    if result.ttft_s is None:
                        result.ttft_s = time.perf_counter() - result.sent
                    result.content_chunks += 1
                result.finish_reason = choice.finish_reason or result.finish_reason
            if chunk.usage is not None:
                usage = chunk.usage
                result.prompt_tokens = usage.prompt_tokens
                result.completion_tokens = usage.completion_tokens
                details = usage.prompt_tokens_details
                result.cached_tokens = details.cached_tokens if details else None
    except openai.APIError as error:
        result.error = {"type": type(error).__name__, "message": str(error)[:300]}
        return result
    result.ended = time.perf_counter()
    result.total_s = result.ended - result.sent
    if result.completion_tokens is None:
        result.error = {"type": "NoUsage", "message": "the stream ended without a usage chunk"}
    return result


def api_client(base_url: str, api_key: str, timeout_s: float):
    """An `openai.AsyncOpenAI` on the server's /v1 (no retries: a failure is a result)."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=timeout_s)


async def warm_up(client, model: str, texts: Texts, max_tokens: int) -> StreamResult:
    """The warm-up stream (it caches the system prompt); CannotRunError if it fails."""
    warm = await stream_one(client, model, texts.system, texts.warmup, max_tokens, -1)
    if warm.error is not None:
        raise CannotRunError(f"the warm-up request failed: {warm.error}")
    return warm


async def stream_at_once(
    client, model: str, system: str, users: list[str], max_tokens: int
) -> tuple[list[StreamResult], float]:
    """One stream per user turn, all at once; (results, wall s from sending to the last end)."""
    began = time.perf_counter()
    results = await asyncio.gather(
        *(
            stream_one(client, model, system, user, max_tokens, index)
            for index, user in enumerate(users)
        )
    )
    ends = [r.ended for r in results if r.ended is not None]
    return list(results), (max(ends) - began if ends else 0.0)


async def drive_api(
    base_url: str, api_key: str, model: str, texts: Texts, max_tokens: int, timeout_s: float
) -> tuple[list[StreamResult], float, StreamResult]:
    """One warm-up stream, then one stream per user turn at once; (results, wall s, warm-up)."""
    async with api_client(base_url, api_key, timeout_s) as client:
        warm = await warm_up(client, model, texts, max_tokens)
        results, wall_s = await stream_at_once(client, model, texts.system, texts.users, max_tokens)
    return results, wall_s, warm


def summarize_api(results: list[StreamResult], wall_s: float) -> dict:
    answered = [r for r in results if r.error is None]
    completion = sum(r.completion_tokens for r in answered)
    errors = [{"client": r.index, **r.error} for r in results if r.error is not None]
    return {
        "throughput_tok_s": rounded(completion / wall_s, 2) if wall_s > 0 else None,
        "wall_s": rounded(wall_s, 3),
        "requests": len(results),
        "answered": len(answered),
        "completion_tokens": completion,
        "prompt_tokens": [r.prompt_tokens for r in results],
        "prompt_tokens_mean": rounded(np.mean([r.prompt_tokens for r in answered]), 1)
        if answered
        else None,
        "cached_tokens_mean": rounded(np.mean([r.cached_tokens or 0 for r in answered]), 1)
        if answered
        else None,
        **_spread([r.ttft_s for r in answered if r.ttft_s is not None], "ttft_p{}_s"),
        **_spread([r.tokens_per_s for r in answered if r.tokens_per_s], "tokens_per_s_p{}", 2),
        "content_chunks_mean": rounded(np.mean([r.content_chunks for r in answered]), 1)
        if answered
        else None,
        "finish_reasons": counts(r.finish_reason for r in answered),
        "errors": len(errors),
        "error_details": errors[:MAX_ERROR_DETAILS],
    }


def _cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


# --- The whole run ---


def run_bench(
    *,
    concurrency: int = 32,
    max_tokens: int = 64,
    smoke: bool = False,
    models_dir: Path | None = None,
    torch_threads: int | None = None,
    kv_cache_mb: int | None = None,
    startup_timeout_s: float = 300.0,
    request_timeout_s: float = 600.0,
) -> dict:
    """Measure (a) the engine in process, then (b) the API over a live server; the report."""
    if smoke:
        concurrency, max_tokens = SMOKE_CONCURRENCY, SMOKE_MAX_TOKENS
    if concurrency < 1 or max_tokens < 1:
        raise ValueError("concurrency and max_tokens must be at least 1")
    base = SMOKE if smoke else Workload()
    workload = Workload(
        system_tokens=base.system_tokens,
        user_tokens=base.user_tokens,
        output_tokens=max_tokens,
        concurrency=(concurrency,),
    )
    models_dir = Path(models_dir) if models_dir is not None else default_models_dir()
    models_dir.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    try:
        with LiveServer(
            models_dir=models_dir,
            torch_threads=torch_threads,
            kv_cache_mb=kv_cache_mb,
            ready_timeout_s=startup_timeout_s,
        ) as server:
            setup = server.call("harness.site:prepare_site", SITE_SPEC, timeout=SITE_TIMEOUT_S)
            engine_config = setup["engine_config"]
            logger.info("engine settings of the server: %s", engine_config)

            # (a) The engine in this process, on the server's threads and settings.
            import torch

            threads_before = torch.get_num_threads()
            if setup["torch_threads"]:
                torch.set_num_threads(setup["torch_threads"])
            try:
                engine, texts = bench_engine(engine_config, workload, concurrency)
                engine["torch_threads"] = torch.get_num_threads()
            finally:
                torch.set_num_threads(threads_before)
            gc.collect()  # the engine's weights and KV cache go before the server loads its own
            logger.info("engine: %s tok/s", engine["throughput_tok_s"])

            # (b) The same prompts through the REST API.
            began = time.perf_counter()
            server.start()
            startup_s = time.perf_counter() - began
            logger.info("server ready in %.1fs on %s", startup_s, server.url)
            server_cpu = _cpu_s(server.pid)
            client_cpu = time.process_time()
            results, wall_s, warm = asyncio.run(
                drive_api(
                    server.url, setup["api_key"], setup["model"], texts, max_tokens,
                    request_timeout_s,
                )
            )  # fmt: skip
            client_cpu = time.process_time() - client_cpu
            server_cpu_end = _cpu_s(server.pid)
            api = summarize_api(results, wall_s)
            api |= {
                "warmup_ttft_s": rounded(warm.ttft_s),
                "startup_s": rounded(startup_s, 2),
                # NOTE: both include the warm-up request; the clients' is this whole process's.
                "server_cpu_s": rounded(server_cpu_end - server_cpu, 2)
                if server_cpu is not None and server_cpu_end is not None
                else None,
                "client_cpu_s": rounded(client_cpu, 2),
                "server_engine": server.engine_metrics(),
            }
            if api["errors"]:
                logger.warning("requests failed; the server's log ends:\n%s", server.log_tail())
    except LiveServerError as error:
        raise CannotRunError(str(error)) from None

    ratio = (
        round(api["throughput_tok_s"] / engine["throughput_tok_s"], 3)
        if api["throughput_tok_s"] and engine["throughput_tok_s"]
        else None
    )
    load_end = os.getloadavg()
    return {
        "engine": engine,
        "api": api,
        "ratio": ratio,
        "target_met": ratio is not None and ratio >= TARGET_RATIO and api["errors"] == 0,
        "prompt_tokens_match": engine["prompt_tokens"] == api["prompt_tokens"],
        "config": {
            "concurrency": concurrency,
            "max_tokens": max_tokens,
            "system_tokens": workload.system_tokens,
            "user_tokens": workload.user_tokens,
            "smoke": smoke,
            "model": setup["model"],
            "engine_config": {k: v for k, v in engine_config.items() if k != "model_dir"},
            "torch_threads": setup["torch_threads"] or 0,  # 0: torch's default, one per core
            "cpu_count": os.cpu_count(),
            "target_ratio": TARGET_RATIO,
            "load_avg_start": [round(x, 2) for x in load_start],
            "load_avg_end": [round(x, 2) for x in load_end],
        },
    }


def format_report(report: dict) -> str:
    config, engine, api = report["config"], report["engine"], report["api"]

    def row(name: str, side: dict) -> str:
        return (
            f"{name:<7} {side['throughput_tok_s'] or 0:>8.1f} {side['wall_s'] or 0:>7.2f}s "
            f"{side['ttft_p50_s'] or 0:>8.3f}s {side['ttft_p95_s'] or 0:>8.3f}s "
            f"{side['tokens_per_s_p50'] or 0:>12.1f} {side['prompt_tokens_mean'] or 0:>8.0f} "
            f"{side['cached_tokens_mean'] or 0:>7.0f}"
        )

    verdict = "met" if report["target_met"] else "NOT met"
    lines = [
        f"{config['concurrency']} streams x {config['max_tokens']} tokens, model "
        f"{config['model']} ({config['engine_config']['dtype']}), {config['cpu_count']} CPUs "
        f"(load {config['load_avg_start'][0]} at the start)",
        "",
        f"{'':<7} {'tok/s':>8} {'wall':>8} {'ttft p50':>9} {'ttft p95':>9} "
        f"{'stream tok/s':>12} {'prompt':>8} {'cached':>7}",
        row("engine", engine),
        row("api", api),
        "",
        f"api / engine: {report['ratio']} (target >= {config['target_ratio']}: {verdict}); "
        f"prompt tokens match: {report['prompt_tokens_match']}; errors {api['errors']}",
    ]
    lines += [f"error: {error}" for error in api["error_details"]]
    return "\n".join(lines)


# --- The command line ---


def add_live_server_arguments(parser: argparse.ArgumentParser, *, request_timeout_s: float) -> None:
    """--models-dir, --startup-timeout and --request-timeout: the options of every benchmark
    that streams from a live server."""
    parser.add_argument(
        "--models-dir",
        type=Path,
        help="the models cache to reuse (default: $CACHET_DATA_DIR/models)",
    )
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--request-timeout", type=float, default=request_timeout_s, help="seconds")


def quiet_http_logs() -> None:
    """No log line per request from the clients' HTTP library."""
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.api", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--concurrency", type=int, default=32, help="streams (default 32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens (default 64)")
    parser.add_argument("--smoke", action="store_true", help="2 streams, 4 tokens, short prompts")
    parser.add_argument("--torch-threads", type=int, help="CACHET_TORCH_THREADS for both sides")
    parser.add_argument("--kv-cache-mb", type=int, help="CACHET_KV_CACHE_MB for both sides")
    add_live_server_arguments(parser, request_timeout_s=600.0)
    args = parser.parse_args(argv)
    if min(args.concurrency, args.max_tokens) < 1:
        parser.error("--concurrency and --max-tokens must be at least 1")
    quiet_http_logs()
    return run_cli(
        lambda: run_bench(
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            smoke=args.smoke,
            models_dir=args.models_dir,
            torch_threads=args.torch_threads,
            kv_cache_mb=args.kv_cache_mb,
            startup_timeout_s=args.startup_timeout,
            request_timeout_s=args.request_timeout,
        ),
        as_json=args.json,
        format_report=format_report,
        num_errors=lambda report: report["api"]["errors"],
    )


if __name__ == "__main__":
    sys.exit(main())
