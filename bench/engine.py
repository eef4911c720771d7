"""Engine benchmark against transformers' own `generate`, both measured in one process and one run.

Workload (issue 3): a fixed ~1,000-token system prompt, a unique ~250-token user turn per request,
64 greedy output tokens with ignore_eos. Prints JSON `{"hf": {...}, "engine": {...}, "ratios":
{...}}`; each side has cold_ttft_s, warm_ttft_s, decode_tok_s (single stream), throughput_tok_s
for 1/8/32 concurrent requests (HF as padded static batches) and peak_rss_mb.

    python -m bench.engine --json            # the full run (several minutes on 2 cores)
    python -m bench.engine --json --smoke    # tiny sizes: checks the harness end to end
    python -m bench.engine --table           # the optimization table -> docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench import optimization_table
from bench.peak_sampler import mb, peak_rss
from bench.workload import SMOKE, Seeds, Workload, build_prompts
from inference.engine import PREFILL_WEIGHTS

logger = logging.getLogger(__name__)


def bench_hf(
    model_dir: Path, tokenizer, workload: Workload, seeds: Seeds, dtype: torch.dtype
) -> dict:
    from transformers import AutoModelForCausalLM

    from inference.model_files import transformers_weights

    with peak_rss() as rss:
        weights = transformers_weights(model_dir)  # a prepared GGUF: its model.gguf
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **weights).eval()
        tokenizer.padding_side = "left"
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

        def run_batch(prompts: list[list[int]], max_new_tokens: int) -> float:
            width = max(map(len, prompts))
            input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            started = time.perf_counter()
            with torch.inference_mode():
                model.generate(
                    input_ids=input_ids,
                    attention_mask=mask,
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=pad_id,
                )
            return time.perf_counter() - started

        # HF has no prefix cache across calls: "warm" repeats the system prompt, new user turn.
        cold_ttft = run_batch(build_prompts(tokenizer, workload, 1, seeds.take(1)), 1)
        warm_ttft = run_batch(build_prompts(tokenizer, workload, 1, seeds.take(1)), 1)
        single = build_prompts(tokenizer, workload, 1, seeds.take(1))
        ttft = run_batch(single, 1)
        total = run_batch(single, workload.output_tokens)
        decode_tok_s = (workload.output_tokens - 1) / max(total - ttft, 1e-9)
        throughput = {}
        for num in workload.concurrency:
            seconds = run_batch(
                build_prompts(tokenizer, workload, num, seeds.take(num)), workload.output_tokens
            )
            throughput[str(num)] = round(num * workload.output_tokens / seconds, 2)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "cold_ttft_s": round(cold_ttft, 4),
        "warm_ttft_s": round(warm_ttft, 4),
        "decode_tok_s": round(decode_tok_s, 2),
        "throughput_tok_s": throughput,
        "peak_rss_mb": mb(rss.peak),
    }


def bench_engine(
    model_dir: Path,
    workload: Workload,
    seeds: Seeds,
    kv_cache_mb: int,
    dtype: str,
    prefill_weights: str | None = None,
) -> dict:
    from inference.engine import Engine, EngineConfig

    with peak_rss() as rss:
        max_concurrency = max(workload.concurrency)
        config = EngineConfig(
            model_dir=model_dir,
            dtype=dtype,
            max_model_len=max(2048, workload.system_tokens + workload.user_tokens + 256),
            kv_cache_mb=kv_cache_mb,
            max_num_seqs=max(max_concurrency, 1),
            max_num_batched_tokens=512,
            **({} if prefill_weights is None else {"prefill_weights": prefill_weights}),
        )
        engine = Engine(config)
        try:
            speed = measure_speed(engine, workload, seeds)
        finally:
            engine.shutdown()
    return {
        "dtype": str(config.dtype).removeprefix("torch."),
        **speed,
        "peak_rss_mb": mb(rss.peak),
    }


def configuration_engine_config(model_dir: Path, **fields):
    """The engine that the per-configuration benchmarks (bench.kernel_levels,
    bench.shared_cores) measure: dtype "auto", 2,048-token contexts, 512 MB of KV cache, 16
    sequences, 512-token steps; `fields` set the configuration under test."""
    from inference.engine import EngineConfig

    defaults = {
        "dtype": "auto",
        "max_model_len": 2048,
        "kv_cache_mb": 512,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 512,
    }
    return EngineConfig(model_dir=model_dir, **(defaults | fields))


def measure_speed(engine, workload: Workload, seeds: Seeds) -> dict:
    """Cold and warm TTFT, single-stream decode and throughput per concurrency of `engine`.

    Cold: the system prompt has never been seen. Warm: same system prompt, new user turn.
    """
    from inference.engine import SamplingParams

    tokenizer = engine.tokenizer
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    full = SamplingParams(temperature=0, max_tokens=workload.output_tokens, ignore_eos=True)
    [cold] = engine.generate(build_prompts(tokenizer, workload, 1, seeds.take(1)), first)
    [warm] = engine.generate(build_prompts(tokenizer, workload, 1, seeds.take(1)), first)
    [single] = engine.generate(build_prompts(tokenizer, workload, 1, seeds.take(1)), full)
    throughput = {}
    for num in workload.concurrency:
        prompts = build_prompts(tokenizer, workload, num, seeds.take(num))
        started = time.perf_counter()
        results = engine.generate(prompts, full)
        seconds = time.perf_counter() - started
        num_tokens = sum(r.usage.completion_tokens for r in results)
        throughput[str(num)] = round(num_tokens / seconds, 2)
    return {
        "cold_ttft_s": round(cold.usage.ttft_s, 4),
        "warm_ttft_s": round(warm.usage.ttft_s, 4),
        "warm_cached_tokens": warm.usage.cached_tokens,
        "decode_tok_s": round(single.usage.tokens_per_s, 2),
        "throughput_tok_s": throughput,
    }


def ratios(hf: dict, engine: dict) -> dict:
    divide: Callable[[float, float], float] = lambda a, b: round(a / b, 3) if b else 0.0  # noqa: E731
    return {
        "engine_warm_over_cold_ttft": divide(engine["warm_ttft_s"], engine["cold_ttft_s"]),
        "engine_over_hf_decode": divide(engine["decode_tok_s"], hf["decode_tok_s"]),
        **{
            f"engine_over_hf_throughput_{num}": divide(
                engine["throughput_tok_s"][num], hf["throughput_tok_s"][num]
            )
            for num in engine["throughput_tok_s"]
        },
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON (default)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the harness")
    parser.add_argument(
        "--model-dir", type=Path, help="model directory (default: the catalogue's default model)"
    )
    parser.add_argument("--models-dir", type=Path, default=Path("var/models"))
    parser.add_argument("--kv-cache-mb", type=int, default=1024)
    parser.add_argument(
        "--engine-dtype", default="auto", help="engine dtype (auto: bf16 where native, else fp32)"
    )
    parser.add_argument("--hf-dtype", default="bfloat16", help="baseline dtype (issue: bf16)")
    parser.add_argument(
        "--prefill-weights",
        choices=PREFILL_WEIGHTS,
        default=None,
        help="the engine's prefill_weights (default: the engine's; README, Prefill weights)",
    )
    parser.add_argument("--skip-hf", action="store_true", help="measure the engine only")
    parser.add_argument(
        "--table", action="store_true", help="the optimization table (see optimization_table.py)"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"), help="--table file")
    parser.add_argument(
        "--chart", type=Path, default=Path("docs/benchmarks.png"), help="--table PNG chart"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from transformers import AutoTokenizer

    from inference.catalogue import DEFAULT_CHAT_MODEL
    from inference.engine import parse_dtype
    from inference.model_files import resolve_chat_model

    model_dir = args.model_dir or resolve_chat_model(DEFAULT_CHAT_MODEL, args.models_dir).directory
    if args.table:
        command = "python -m bench.engine " + " ".join(sys.argv[1:] if argv is None else argv)
        table = optimization_table.write_table(
            model_dir,
            smoke=args.smoke,
            kv_cache_mb=args.kv_cache_mb,
            out=args.out,
            chart=args.chart,
            command=command.strip(),
        )
        json.dump(table, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return table
    workload = SMOKE if args.smoke else Workload()
    seeds = Seeds()
    result: dict = {"workload": {
        "system_tokens": workload.system_tokens,
        "user_tokens": workload.user_tokens,
        "output_tokens": workload.output_tokens,
        "torch_threads": torch.get_num_threads(),
    }}  # fmt: skip
    result["engine"] = bench_engine(
        model_dir, workload, seeds, args.kv_cache_mb, args.engine_dtype, args.prefill_weights
    )
    if not args.skip_hf:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        hf_dtype = parse_dtype(args.hf_dtype)
        result["hf"] = bench_hf(model_dir, tokenizer, workload, seeds, hf_dtype)
        result["ratios"] = ratios(result["hf"], result["engine"])
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return result


if __name__ == "__main__":
    main()
