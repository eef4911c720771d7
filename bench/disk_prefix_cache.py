"""The prefix cache's disk tier: TTFT of the first request after a restart, against a warm one.

One engine configuration as served (dtype, weight and KV formats "auto"), one prompt: a long
fixed prefix (squad-dev passages as a RAG system prompt, `--prefix-tokens`) and a question,
through the model's chat template, one output token (so the time is the TTFT). Measured in one
run, in this order:

- **cold**: a new engine, nothing cached anywhere: the whole prompt is prefilled (and its blocks
  queued for the disk);
- **warm**: the same engine again: the prefix from memory (the in-memory prefix cache);
- **restart, warmed up**: a new engine (an empty in-memory cache) on the same weights with its
  KV tensors zeroed, asked once it has loaded the disk tier's newest blocks while idle (what a
  restart gives the first chat that comes after the start-up);
- **restart, asked at once, page cache**: the request sent as the new engine starts, so it reads
  its prefix's blocks from the disk tier itself, files the OS still holds in its page cache;
- **restart, asked at once, from disk**: the same after every block file was dropped from the
  page cache (`posix_fadvise(DONTNEED)`), so the blocks come off the device (after a reboot).

Each restart is measured `--rounds` times (medians), each time followed at once by a warm request
on the same engine: "x warm" is the median of those paired ratios (the target is <= 1.2), which
holds where the machine's load drifts between rounds.
NOTE: a restart here is a new engine in the same process: the weights stay loaded, the KV
cache's memory stays allocated; what a real restart adds (loading the weights) happens before
the first request can be served at all and is not part of its TTFT.

    python -m bench.disk_prefix_cache                 # the default model, ~1,000-token prefix
    python -m bench.disk_prefix_cache --smoke         # the bundled SmolLM2, 300 tokens: seconds
    python -m bench.disk_prefix_cache --model qwen2.5-coder-0.5b-instruct --json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.squad_questions import SquadDataError, load_passages
from harness import CannotRunError, chat_model_dir, cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL, DEFAULT_CHAT_MODEL

QUESTION = "According to the passages above, what is the first topic they cover?"
DEFAULT_PREFIX_TOKENS = 1000
SMOKE_PREFIX_TOKENS = 300


def rag_prompt(tokenizer, prefix_tokens: int) -> list[int]:
    """A system prompt of squad-dev passages of about `prefix_tokens` tokens, then a question."""
    try:
        passages = load_passages()
    except SquadDataError as error:
        raise CannotRunError(str(error)) from None
    parts: list[str] = []
    for index, passage in enumerate(passages, start=1):
        parts.append(f"[{index}] {passage.title}\n{passage.text}")
        if len(tokenizer.encode("\n\n".join(parts))) >= prefix_tokens:
            break
    messages = [
        {"role": "system", "content": "Answer from these passages.\n\n" + "\n\n".join(parts)},
        {"role": "user", "content": QUESTION},
    ]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def drop_from_page_cache(directory: Path) -> int:
    """Ask the OS to forget the cached pages of every file under `directory`; the count."""
    count = 0
    for path in directory.rglob("*.kv"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # NOTE: dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        count += 1
    return count


def run_bench(*, model: str, prefix_tokens: int, rounds: int, models_dir: Path) -> dict:
    from inference.engine import EngineConfig, ModelRunner
    from inference.engine.core.sampling_params import SamplingParams
    from inference.engine.engine import Engine, _load_tokenizer

    model_dir = chat_model_dir(model, models_dir)
    with tempfile.TemporaryDirectory(prefix="cachet-kv-disk-") as disk:
        config = EngineConfig(
            model_dir, max_model_len=prefix_tokens + 512, kv_disk_cache_dir=Path(disk)
        )
        runner = ModelRunner(config)
        tokenizer = _load_tokenizer(model_dir)
        prompt = rag_prompt(tokenizer, prefix_tokens)
        params = SamplingParams(temperature=0, max_tokens=1)

        def new_engine() -> Engine:
            for tensor in runner.kv_cache.storage:
                tensor.zero_()
            return Engine(config, runner=runner, tokenizer=tokenizer)

        def first_token_s(engine: Engine) -> tuple[float, int]:
            began = time.perf_counter()
            (output,) = engine.generate([prompt], params)
            return time.perf_counter() - began, output.usage.cached_tokens

        engine = new_engine()
        cold_s, _ = first_token_s(engine)
        warm = [first_token_s(engine) for _ in range(max(3, rounds))]
        disk_cache = engine.core.disk_cache
        engine.shutdown()  # writes what it queued
        # (first request's TTFT, its cached tokens, its TTFT over the warm one right after it)
        restarts: dict[str, list[tuple[float, int, float]]] = {
            "warmed up": [],
            "asked at once, page cache": [],
            "asked at once, from disk": [],
        }
        for _ in range(rounds):
            for kind, samples in restarts.items():
                if kind.endswith("from disk"):
                    drop_from_page_cache(Path(disk))
                engine = new_engine()
                if kind == "warmed up":
                    while engine.core.is_warming_up:
                        time.sleep(0.01)
                first_s, cached = first_token_s(engine)
                # NOTE: paired with a warm request on the same engine at once, so the ratio
                # holds on a machine whose load drifts.
                warm_after_s, _ = first_token_s(engine)
                samples.append((first_s, cached, first_s / warm_after_s))
                engine.shutdown()
        block_files = list(Path(disk).rglob("*.kv"))
        disk_bytes = sum(path.stat().st_size for path in block_files)

    warm_s = statistics.median(s for s, _ in warm)
    rows = [
        {"case": "cold (prefill)", "ttft_s": cold_s, "cached_tokens": 0},
        {"case": "warm (memory)", "ttft_s": warm_s, "cached_tokens": warm[0][1]},
    ]
    rows[0]["vs_warm"], rows[1]["vs_warm"] = cold_s / warm_s, 1.0
    for kind, samples in restarts.items():
        rows.append(
            {
                "case": f"restart, {kind}",
                "ttft_s": statistics.median(s for s, _, _ in samples),
                "cached_tokens": min(cached for _, cached, _ in samples),
                "vs_warm": statistics.median(ratio for _, _, ratio in samples),
            }
        )
    for row in rows:
        row["vs_warm"] = rounded(row["vs_warm"], 2)
        row["ttft_s"] = rounded(row["ttft_s"], 4)
    return {
        "config": {
            "model": model,
            "dtype": str(runner.dtype).removeprefix("torch."),
            "prompt_tokens": len(prompt),
            "rounds": rounds,
            "block_files": len(block_files),
            "disk_mib": rounded(disk_bytes / 2**20, 1),
            "disk_kib_per_token": rounded(disk_bytes / 1024 / max(1, len(block_files)) / 16, 1),
            "blocks_written": disk_cache.num_written if disk_cache else 0,
            "cpu": cpu_name(),
        },
        "results": rows,
    }


def format_report(report: dict) -> str:
    config = report["config"]
    lines = [
        f"{config['model']} ({config['dtype']}), {config['prompt_tokens']}-token prompt, "
        f"{config['rounds']} rounds, {config['cpu']}",
        f"disk tier: {config['block_files']} block files, {config['disk_mib']} MiB "
        f"({config['disk_kib_per_token']} KiB per token)",
        "",
        f"{'first request':<36} {'TTFT s':>8} {'cached':>7} {'x warm':>7}",
    ]
    for row in report["results"]:
        lines.append(
            f"{row['case']:<36} {row['ttft_s']:>8.3f} {row['cached_tokens']:>7} "
            f"{row['vs_warm']:>7.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.disk_prefix_cache", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--model", help=f"a chat model (default {DEFAULT_CHAT_MODEL})")
    parser.add_argument("--prefix-tokens", type=int, help="the fixed prefix's length (~1000)")
    parser.add_argument("--rounds", type=int, default=5, help="restarts measured (default 5)")
    parser.add_argument(
        "--models-dir", type=Path, help="prepared models (default: the data dir's models folder)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help=f"{BUNDLED_CHAT_MODEL}, a short prefix, 2 rounds"
    )
    args = parser.parse_args(argv)
    model = args.model or (BUNDLED_CHAT_MODEL if args.smoke else DEFAULT_CHAT_MODEL)
    prefix_tokens = args.prefix_tokens or (
        SMOKE_PREFIX_TOKENS if args.smoke else DEFAULT_PREFIX_TOKENS
    )
    rounds = 2 if args.smoke else args.rounds
    if prefix_tokens < 32 or rounds < 1:
        parser.error("--prefix-tokens must be >= 32 and --rounds >= 1")
    return run_cli(
        lambda: run_bench(
            model=model,
            prefix_tokens=prefix_tokens,
            rounds=rounds,
            models_dir=args.models_dir or default_models_dir(),
        ),
        as_json=args.json,
        format_report=format_report,
        num_errors=lambda report: 0,
    )


if __name__ == "__main__":
    sys.exit(main())
