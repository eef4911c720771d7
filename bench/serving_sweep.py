"""Many users at once: each model via the API at 1, 8 and 32 concurrent streams, against its limits.

For each `--model`, one live server (`harness.live_server.LiveServer`, CACHET_MODEL set to it) on
its own throwaway data dir, the model's cache shared. After one warm-up stream (it puts the system
prompt in the prefix cache), each `--concurrency` level runs in turn on the same warm server:
that many `openai.AsyncOpenAI` clients stream `/v1/chat/completions` at once (bench.api's
driver: greedy, `ignore_eos`, usage in the stream), each with a user turn no other request sent.
The workload is bench.workload's RAG-like one: a fixed ~1,000-token system prompt, a unique
~250-token user turn, `--max-tokens` (64) output tokens.

Per level: output tok/s (completion tokens / wall time from the first request to the last
`[DONE]`), TTFT p50/p95, per-stream decode tok/s p50, cached prompt tokens, errors; and the
limits this machine puts on it (bench.machine_limits): memory bandwidth and GEMM peaks measured
in the same run, before any server starts, at the server's torch thread count; the model's shape
read from the engine's own load of it (parameters from its model class, weight bytes as
loaded). Each level's output tok/s is reported as a share of the applicable limit.

    python -m bench.serving_sweep --json --model qwen2.5-coder-1.5b-instruct \\
        --model smollm2-135m-instruct                   # a few minutes on 2 cores
    python -m bench.serving_sweep --smoke               # SmolLM2, 1 and 2 streams, 4 tokens
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
import time
from pathlib import Path

from bench.api import (
    Texts,
    add_live_server_arguments,
    api_client,
    quiet_http_logs,
    stream_at_once,
    summarize_api,
    warm_up,
    workload_texts,
)
from bench.machine_limits import (
    MachineLimits,
    ModelShape,
    level_limits,
    measure_machine_limits,
    shares_of,
)
from bench.workload import SMOKE, Workload
from harness import (
    SITE_TIMEOUT_S,
    CannotRunError,
    LiveServer,
    LiveServerError,
    cpu_name,
    default_models_dir,
    rounded,
    run_cli,
)
from inference.catalogue import BUNDLED_CHAT_MODEL

logger = logging.getLogger(__name__)

CONCURRENCY = (1, 8, 32)
SMOKE_CONCURRENCY, SMOKE_MAX_TOKENS = (1, 2), 4
SMOKE_REPEATS = 2  # of each machine-limit measurement (5 otherwise)
SITE_SPEC = {"label": "serving-sweep", "users": 0, "api_key": True, "engine_config": True}
# Of summarize_api's report: the per-request list, too long for a table of levels.
LEVEL_DROPPED = ("prompt_tokens",)


# --- The model's shape ---


def served_shape(engine_config: dict) -> tuple[ModelShape, dict]:
    """The shape of the model the server will load, from the engine's own load of it here.

    NOTE: loaded in this process before the server starts (and freed before it does), on the
    server's settings, so the weight bytes are those the engine holds (a GGUF's formats as
    loaded), not the checkpoint's; the parameter count comes from the model class on the meta
    device, since quantized layers hold packed codes, not parameters.
    """
    import torch

    from inference.engine import model_weight_bytes
    from inference.engine.config import parse_dtype
    from inference.engine.loader import load_model

    loaded = load_model(
        engine_config["model_dir"],
        dtype=parse_dtype(engine_config["dtype"]),
        native_kernels=engine_config["native_kernels"],
        quantization=engine_config["quantization"],
        quantization_group_size=engine_config["quantization_group_size"],
    )
    model, args = loaded.model, loaded.model.args
    # A decode step reads every weight but the embedding table's (one row of it), unless the
    # table is the logits head as well.
    read = [child for name, child in model.named_children() if name != "embed_tokens"]
    if model.lm_head is None:
        read.append(model.embed_tokens)
    with torch.device("meta"):
        skeleton = type(model)(args, native_kernels=False)
    shape = ModelShape(
        non_embedding_params=sum(
            p.numel()
            for name, p in skeleton.named_parameters()
            if not name.startswith(("embed_tokens.", "lm_head."))
        ),
        lm_head_params=args.vocab_size * args.hidden_size,
        weight_bytes_per_token=model_weight_bytes(torch.nn.ModuleList(read)),
    )
    details = {
        "non_embedding_params": shape.non_embedding_params,
        "lm_head_params": shape.lm_head_params,
        "weight_bytes_per_token": shape.weight_bytes_per_token,
        "weight_bytes": loaded.report.weight_bytes,
        "formats": loaded.report.formats,
        "num_layers": args.num_layers,
        "hidden_size": args.hidden_size,
        "vocab_size": args.vocab_size,
    }
    del loaded, model, skeleton
    gc.collect()
    return shape, details


# --- One model ---


async def drive_levels(
    server: LiveServer,
    setup: dict,
    texts: Texts,
    levels: tuple[int, ...],
    max_tokens: int,
    timeout_s: float,
) -> tuple[list[dict], float | None]:
    """One warm-up stream, then each level's streams at once, in turn; (levels, warm-up TTFT)."""
    model = setup["model"]
    reports = []
    async with api_client(server.url, setup["api_key"], timeout_s) as client:
        warm = await warm_up(client, model, texts, max_tokens)
        first = 0
        for concurrency in levels:
            users = texts.users[first : first + concurrency]
            first += concurrency
            results, wall_s = await stream_at_once(client, model, texts.system, users, max_tokens)
            summary = summarize_api(results, wall_s)
            logger.info(
                "%s at %d: %s tok/s, %d errors",
                model,
                concurrency,
                summary["throughput_tok_s"],
                summary["errors"],
            )
            reports.append({"concurrency": concurrency} | summary)
    return reports, warm.ttft_s


def with_limits(
    level: dict, limits: MachineLimits, shape: ModelShape, dtype: str, max_tokens: int
) -> dict:
    """A level's report with its limits and its output tok/s as shares of them."""
    new_prompt = (level["prompt_tokens_mean"] or 0) - (level["cached_tokens_mean"] or 0)
    found = level_limits(
        limits,
        shape,
        dtype=dtype,
        concurrency=level["concurrency"],
        new_prompt_tokens=new_prompt,
        output_tokens=max_tokens,
    )
    shares = shares_of(level["throughput_tok_s"], found)
    return (
        {key: value for key, value in level.items() if key not in LEVEL_DROPPED}
        | {"limits": {k: rounded(v, 2) if isinstance(v, float) else v for k, v in found.items()}}
        | {key: rounded(value, 3) for key, value in shares.items()}
    )


def sweep_model(
    name: str | None,
    *,
    models_dir: Path,
    workload: Workload,
    levels: tuple[int, ...],
    limits: MachineLimits | None,
    limit_repeats: int,
    startup_timeout_s: float,
    request_timeout_s: float,
) -> tuple[dict, MachineLimits]:
    """One server for `name` (None: the configured model): its levels; the machine's limits,
    measured before this server starts when `limits` is None."""
    from transformers import AutoTokenizer

    env = {"CACHET_MODEL": name} if name else {}
    with LiveServer(models_dir=models_dir, env=env, ready_timeout_s=startup_timeout_s) as server:
        setup = server.call("harness.site:prepare_site", SITE_SPEC, timeout=SITE_TIMEOUT_S)
        engine_config = setup["engine_config"]
        if limits is None:
            limits = measure_machine_limits(setup["torch_threads"], repeats=limit_repeats)
            logger.info("machine limits: %s", limits)
        shape, shape_details = served_shape(engine_config)
        logger.info("%s: %s", setup["model"], shape_details)
        tokenizer = AutoTokenizer.from_pretrained(str(engine_config["model_dir"]))
        texts = workload_texts(tokenizer, workload, sum(levels))

        began = time.perf_counter()
        server.start()
        startup_s = time.perf_counter() - began
        logger.info("server for %s ready in %.1fs on %s", setup["model"], startup_s, server.url)
        level_reports, warmup_ttft_s = asyncio.run(
            drive_levels(server, setup, texts, levels, workload.output_tokens, request_timeout_s)
        )
        if any(level["errors"] for level in level_reports):
            logger.warning("requests failed; the server's log ends:\n%s", server.log_tail())
        engine_metrics = server.engine_metrics()
    dtype = engine_config["dtype"]
    return {
        "model": setup["model"],
        "requested": name,
        "dtype": dtype,
        "quantization": engine_config["quantization"],
        "shape": shape_details,
        "startup_s": rounded(startup_s, 2),
        "warmup_ttft_s": rounded(warmup_ttft_s),
        "levels": [
            with_limits(level, limits, shape, dtype, workload.output_tokens)
            for level in level_reports
        ],
        "server_engine": engine_metrics,
        "engine_config": {k: v for k, v in engine_config.items() if k != "model_dir"},
    }, limits


# --- The whole run ---


def run_sweep(
    *,
    models: list[str] | None = None,
    concurrency: tuple[int, ...] = CONCURRENCY,
    max_tokens: int = 64,
    smoke: bool = False,
    models_dir: Path | None = None,
    startup_timeout_s: float = 300.0,
    request_timeout_s: float = 900.0,
) -> dict:
    """The machine's limits, then each model's levels on a server of its own; the report."""
    if smoke:
        models = [BUNDLED_CHAT_MODEL]
        concurrency, max_tokens = SMOKE_CONCURRENCY, SMOKE_MAX_TOKENS
    if not concurrency or min(concurrency) < 1 or max_tokens < 1:
        raise ValueError("concurrency levels and max_tokens must be at least 1")
    base = SMOKE if smoke else Workload()
    workload = Workload(
        system_tokens=base.system_tokens,
        user_tokens=base.user_tokens,
        output_tokens=max_tokens,
        concurrency=tuple(concurrency),
    )
    models_dir = Path(models_dir) if models_dir is not None else default_models_dir()
    models_dir.mkdir(parents=True, exist_ok=True)
    load_start, began = os.getloadavg(), time.perf_counter()
    limits: MachineLimits | None = None
    reports = []
    try:
        for name in models or [None]:
            report, limits = sweep_model(
                name,
                models_dir=models_dir,
                workload=workload,
                levels=workload.concurrency,
                limits=limits,
                limit_repeats=SMOKE_REPEATS if smoke else 5,
                startup_timeout_s=startup_timeout_s,
                request_timeout_s=request_timeout_s,
            )
            reports.append(report)
    except LiveServerError as error:
        raise CannotRunError(str(error)) from None
    if limits is None:  # NOTE: no model ran (an empty list); sweep_model always measures
        raise CannotRunError("no model to run")
    return {
        "machine": {"cpu": cpu_name(), "cpu_count": os.cpu_count()} | limits.to_json(),
        "models": reports,
        "config": {
            "concurrency": list(workload.concurrency),
            "max_tokens": max_tokens,
            "system_tokens": workload.system_tokens,
            "user_tokens": workload.user_tokens,
            "smoke": smoke,
            "wall_s": rounded(time.perf_counter() - began, 1),
            "load_avg_start": [round(x, 2) for x in load_start],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        },
    }


def num_errors(report: dict) -> int:
    return sum(level["errors"] for model in report["models"] for level in model["levels"])


def format_report(report: dict) -> str:
    machine, config = report["machine"], report["config"]
    int8 = machine["int8_gop_s"]
    lines = [
        f"{machine['cpu']}, {machine['cpu_count']} CPUs, {machine['threads']} torch threads: "
        f"read {machine['read_gb_s']} GB/s, GEMM bf16 {machine['bf16_gflop_s']} / fp32 "
        f"{machine['fp32_gflop_s']} GFLOP/s, int8 {int8 if int8 is not None else 'n/a'} GOP/s",
        f"{config['system_tokens']}-token system prompt, {config['user_tokens']}-token user "
        f"turns, {config['max_tokens']} tokens out; load {config['load_avg_start'][0]} at the "
        f"start, {config['load_avg_end'][0]} at the end",
        "",
        f"{'model':<30} {'streams':>7} {'tok/s':>7} {'ttft p50':>9} {'ttft p95':>9} "
        f"{'stream tok/s':>12} {'cached':>7} {'limit':>8} {'bound':>9} {'share':>6} {'errors':>6}",
    ]
    for model in report["models"]:
        for level in model["levels"]:
            limits = level["limits"]
            lines.append(
                f"{model['model']:<30} {level['concurrency']:>7} "
                f"{level['throughput_tok_s'] or 0:>7.1f} {level['ttft_p50_s'] or 0:>8.3f}s "
                f"{level['ttft_p95_s'] or 0:>8.3f}s {level['tokens_per_s_p50'] or 0:>12.1f} "
                f"{level['cached_tokens_mean'] or 0:>7.0f} {limits['limit_tok_s']:>8.1f} "
                f"{limits['bound']:>9} {level['share_of_limit'] or 0:>6.3f} {level['errors']:>6}"
            )
    lines += [
        f"error ({model['model']}, {level['concurrency']}): {error}"
        for model in report["models"]
        for level in model["levels"]
        for error in level["error_details"]
    ]
    return "\n".join(lines)


def parse_levels(text: str) -> tuple[int, ...]:
    """ "1,8,32" -> (1, 8, 32); argparse's error for anything else."""
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every level must be at least 1")
    return levels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving_sweep", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument(
        "--model",
        action="append",
        help="a catalogue name; repeat for several (default: the configured model)",
    )
    parser.add_argument(
        "--concurrency",
        type=parse_levels,
        default=CONCURRENCY,
        help="streams at once, one level after another (default 1,8,32)",
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens (default 64)")
    parser.add_argument(
        "--smoke", action="store_true", help="SmolLM2, 1 and 2 streams, 4 tokens, short prompts"
    )
    add_live_server_arguments(parser, request_timeout_s=900.0)
    args = parser.parse_args(argv)
    if args.max_tokens < 1:
        parser.error("--max-tokens must be at least 1")
    quiet_http_logs()
    return run_cli(
        lambda: run_sweep(
            models=args.model,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            smoke=args.smoke,
            models_dir=args.models_dir,
            startup_timeout_s=args.startup_timeout,
            request_timeout_s=args.request_timeout,
        ),
        as_json=args.json,
        format_report=format_report,
        num_errors=num_errors,
    )


if __name__ == "__main__":
    sys.exit(main())
