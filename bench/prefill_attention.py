"""Prefill attention: the native paged kernel against PyTorch's gather + SDPA, one layer and whole
prompts.

Layer: for each model's attention shape (query heads, KV heads, head size) and each kind of
prefill chunk, `layers.attention.paged_attention` as a step runs it, with metadata built for the
native kernel (`kernels/paged_prefill_attention.c`: the context read in place) and for PyTorch
(the context gathered, then `F.scaled_dot_product_attention` with an offset-causal mask). The
caches are in `--dtype` (default: the dtype the engine runs models in on this CPU: bf16 where
it is native, float32 elsewhere), the blocks scattered. Each cell: milliseconds per call (the
median of repeats) and GFLOP/s counting the attended (query, key) pairs only (4 x head size
FLOPs each, a query attends the keys up to its position).

Prompts (with `--model`): the engine on that model, its runner switched between the two paths
in one process on the same workload as bench.engine (a fixed ~1,000-token system prompt, a new
~250-token user turn): cold TTFT (nothing cached) and warm TTFT (the system prompt cached), each
the median of `--repeats` requests with fresh prompts. Then `--streams` such requests at once
(64 output tokens each), the fused decode attending their shared system prompt apart (the
shared-prefix kernel, cascade) or each whole context: output tok/s and the mean decode step.

    python -m bench.prefill_attention                          # layers only
    python -m bench.prefill_attention --model smollm2-135m-instruct --json
    python -m bench.prefill_attention --dtype float32     # what CPUs without bf16 run
    python -m bench.prefill_attention --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.quantized_matmul import time_call
from harness import CannotRunError, cpu_name, rounded, run_cli

WAYS = ("kernel", "pytorch")
BLOCK_SIZE = 16
MIN_SECONDS = 0.3


@dataclass(frozen=True)
class Chunk:
    """A prefill chunk: `num_queries` new tokens after `num_cached` cached ones."""

    name: str
    num_cached: int
    num_queries: int


# (query heads, KV heads, head size) of the catalogue's models
SHAPES = {
    "smollm2-135m": (9, 3, 64),
    "qwen2.5-0.5b": (14, 2, 64),
    "qwen2.5-1.5b": (12, 2, 128),
}
CHUNKS = (
    Chunk("first chunk", 0, 512),
    Chunk("second chunk", 512, 512),
    Chunk("new turn", 1008, 256),
)
SMOKE_SHAPES = {"smollm2-135m": (9, 3, 64)}
SMOKE_CHUNKS = (Chunk("new turn", 40, 24),)


def attention_calls(
    shape: tuple[int, int, int], chunk: Chunk, dtype: torch.dtype = torch.bfloat16
) -> dict:
    """paged_attention of one layer for `chunk` in `dtype`, through each way's metadata."""
    from inference.engine.layers.attention import build_attention_metadata, paged_attention

    num_heads, num_kv_heads, head_dim = shape
    context = chunk.num_cached + chunk.num_queries
    num_blocks = -(-context // BLOCK_SIZE)
    generator = torch.Generator().manual_seed(0)
    cache_shape = (num_blocks + 8, num_kv_heads, BLOCK_SIZE, head_dim)
    k_cache = torch.randn(cache_shape, generator=generator).to(dtype)
    v_cache = torch.randn(cache_shape, generator=generator).to(dtype)
    table = torch.randperm(num_blocks + 8, generator=generator)[:num_blocks].tolist()
    q = torch.randn(chunk.num_queries, num_heads, head_dim, generator=generator)
    k = torch.randn(chunk.num_queries, num_kv_heads, head_dim, generator=generator)
    v = torch.randn(chunk.num_queries, num_kv_heads, head_dim, generator=generator)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    calls = {}
    for way in WAYS:
        metadata = build_attention_metadata(
            [chunk.num_queries],
            [chunk.num_cached],
            [table],
            block_size=BLOCK_SIZE,
            num_kv_heads=num_kv_heads,
            prefill_kernel=way == "kernel",
        )

        def call(metadata=metadata) -> torch.Tensor:
            return paged_attention(
                q, k, v, k_cache, v_cache, metadata, scale=head_dim**-0.5, is_kv_stored=True
            )

        calls[way] = call
    return calls


def attended_flops(shape: tuple[int, int, int], chunk: Chunk) -> int:
    num_heads, _, head_dim = shape
    pairs = sum(chunk.num_cached + i + 1 for i in range(chunk.num_queries))
    return 4 * num_heads * head_dim * pairs


def measure_layers(
    shapes: dict, chunks: tuple[Chunk, ...], min_seconds: float, dtype: torch.dtype
) -> list[dict]:
    rows = []
    for model, shape in shapes.items():
        for chunk in chunks:
            calls = attention_calls(shape, chunk, dtype)
            flops = attended_flops(shape, chunk)
            row: dict = {
                "model": model,
                "heads": list(shape),
                "chunk": chunk.name,
                "cached": chunk.num_cached,
                "queries": chunk.num_queries,
            }
            for way in WAYS:
                seconds = time_call(calls[way], min_seconds)
                row[f"{way}_ms"] = rounded(seconds * 1000)
                row[f"{way}_gflop_s"] = rounded(flops / seconds / 1e9, 1)
            row["speedup"] = rounded(row["pytorch_ms"] / row["kernel_ms"], 2)
            rows.append(row)
    return rows


def measure_prompts(
    model: str, models_dir: Path, repeats: int, streams: int, dtype: torch.dtype
) -> dict:
    """Cold and warm TTFT of the engine on `model` in `dtype`, each way, in this process."""
    from bench.workload import Seeds, Workload, build_prompts
    from inference.engine import Engine, EngineConfig, SamplingParams
    from inference.model_files import resolve_chat_model

    workload = Workload()
    model_dir = resolve_chat_model(model, models_dir).directory
    config = EngineConfig(
        model_dir=model_dir,
        dtype=dtype,
        max_model_len=2048,
        kv_cache_mb=1024,
        max_num_seqs=32,
        max_num_batched_tokens=512,
    )
    first_token = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    seeds = Seeds()
    results: dict = {"model": model}
    with Engine(config) as engine:
        runner = engine.core.runner
        if not runner.uses_prefill_kernel:
            raise CannotRunError("the engine does not use the native prefill kernel here")

        system_seeds = iter(range(1, 1_000_000))

        def ttft(system_seed: int) -> float:
            """A new user turn after system prompt `system_seed`."""
            prompts = build_prompts(
                engine.tokenizer, workload, 1, seeds.take(1), system_seed=system_seed
            )
            [output] = engine.generate(prompts, first_token)
            return output.usage.ttft_s

        ttft(next(system_seeds))  # builds, first-touch pages, the shapes' first steps
        for way in WAYS:
            runner.uses_prefill_kernel = way == "kernel"
            cold, warm = [], []
            for _ in range(repeats):
                system_seed = next(system_seeds)  # a system prompt never sent: cold
                cold.append(ttft(system_seed))
                warm.append(ttft(system_seed))
            results[f"{way}_cold_ttft_s"] = rounded(statistics.median(cold))
            results[f"{way}_warm_ttft_s"] = rounded(statistics.median(warm))
            results[f"{way}_warm_over_cold"] = rounded(
                results[f"{way}_warm_ttft_s"] / results[f"{way}_cold_ttft_s"], 3
            )
        runner.uses_prefill_kernel = True
        results.update(measure_shared_prefix_decodes(engine, workload, seeds, streams))
    return results


def measure_shared_prefix_decodes(engine, workload, seeds, streams: int) -> dict:
    """`streams` requests of one system prompt at once, the fused decode's cascade on and off:
    output tok/s and the mean seconds of a decode step of them all."""
    from bench.workload import build_prompts
    from inference.engine import SamplingParams

    fused = engine.core.runner.model.fused_decode
    if fused is None or not fused.cascades:
        return {}
    step_seconds: list[float] = []
    call = type(fused).__call__

    def timed_call(self, x, cos, sin, metadata):
        started = time.perf_counter()
        output = call(self, x, cos, sin, metadata)
        if x.shape[0] == streams:
            step_seconds.append(time.perf_counter() - started)
        return output

    results: dict = {"streams": streams}
    outputs = SamplingParams(temperature=0, max_tokens=workload.output_tokens, ignore_eos=True)
    # NOTE: the system prompt cached first, as a server holds it: requests that prefill it at
    # once would each write their own blocks, and their decodes would share none.
    engine.generate(
        build_prompts(engine.tokenizer, workload, 1, seeds.take(1)),
        SamplingParams(temperature=0, max_tokens=1),
    )
    type(fused).__call__ = timed_call
    try:
        for way in ("cascade", "whole"):
            fused.cascades = way == "cascade"
            step_seconds.clear()
            prompts = build_prompts(engine.tokenizer, workload, streams, seeds.take(streams))
            started = time.perf_counter()
            done = engine.generate(prompts, outputs)
            seconds = time.perf_counter() - started
            tokens = sum(output.usage.completion_tokens for output in done)
            results[f"{way}_tok_s"] = rounded(tokens / seconds, 2)
            results[f"{way}_decode_step_s"] = rounded(statistics.fmean(step_seconds))
    finally:
        type(fused).__call__ = call
        fused.cascades = True
    return results


def run_benchmark(
    *, shapes: dict, chunks: tuple[Chunk, ...], min_seconds: float, model: str | None,
    models_dir: Path, repeats: int, dtype: torch.dtype, streams: int = 32,
) -> dict:  # fmt: skip
    from inference.engine.kernels import isa_level, paged_prefill_attention

    if not paged_prefill_attention.is_supported(dtype, torch.device("cpu"), 9, 3, 64):
        raise CannotRunError(f"the native prefill kernel does not serve {dtype} on this CPU")
    level = isa_level()
    report: dict = {
        "config": {
            "cpu": cpu_name(),
            "kernel_isa": None if level is None else level.name,
            "dtype": str(dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
            "engine_prefers_kernel": paged_prefill_attention.is_preferred(dtype),
        },
        "results": measure_layers(shapes, chunks, min_seconds, dtype),
    }
    if model is not None:
        report["prompts"] = measure_prompts(model, models_dir, repeats, streams, dtype)
    return report


def format_table(report: dict) -> str:
    config = report["config"]
    lines = [
        f"Prefill attention on {config['cpu']} ({config['kernel_isa']} kernels, {config['dtype']}, "
        f"{config['torch_threads']} threads): ms per layer call (GFLOP/s)",
        "",
        "| model (heads, KV heads, dim) | chunk | cached + new | native kernel | PyTorch "
        "| speed-up |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        heads = ", ".join(str(n) for n in row["heads"])
        lines.append(
            f"| {row['model']} ({heads}) | {row['chunk']} | {row['cached']} + {row['queries']} | "
            f"{row['kernel_ms']:.2f} ({row['kernel_gflop_s']:.0f}) | "
            f"{row['pytorch_ms']:.2f} ({row['pytorch_gflop_s']:.0f}) | {row['speedup']:.2f}x |"
        )
    prompts = report.get("prompts")
    if prompts:
        lines += ["", f"{prompts['model']}, TTFT (median):", ""]
        lines += ["| | native kernel | PyTorch |", "|---|---:|---:|"]
        for key, label in (
            ("cold_ttft_s", "cold TTFT s"),
            ("warm_ttft_s", "warm TTFT s"),
            ("warm_over_cold", "warm / cold"),
        ):
            lines.append(f"| {label} | {prompts[f'kernel_{key}']} | {prompts[f'pytorch_{key}']} |")
        if "cascade_tok_s" in prompts:
            heading = f"{prompts['streams']} streams of one system prompt, the fused decode:"
            lines += ["", heading, "", "| | shared prefix apart | whole contexts |"]
            lines.append("|---|---:|---:|")
            for key, label in (("tok_s", "output tok/s"), ("decode_step_s", "decode step s")):
                apart, whole = prompts[f"cascade_{key}"], prompts[f"whole_{key}"]
                lines.append(f"| {label} | {apart} | {whole} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prefill_attention", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--smoke", action="store_true", help="one tiny shape, no prompts")
    parser.add_argument("--model", help="also time whole prompts on this catalogue model")
    parser.add_argument("--models-dir", type=Path, default=Path("var/models"))
    parser.add_argument("--repeats", type=int, default=3, help="requests per TTFT median")
    parser.add_argument("--streams", type=int, default=32, help="requests at once (decodes)")
    parser.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="caches and model (auto: the engine's on this CPU)",
    )
    args = parser.parse_args(argv)

    def run() -> dict:
        from inference.engine import parse_dtype

        return run_benchmark(
            shapes=SMOKE_SHAPES if args.smoke else SHAPES,
            chunks=SMOKE_CHUNKS if args.smoke else CHUNKS,
            min_seconds=0.02 if args.smoke else MIN_SECONDS,
            model=args.model,
            models_dir=args.models_dir,
            repeats=args.repeats,
            streams=args.streams,
            dtype=parse_dtype(args.dtype),
        )

    return run_cli(run, as_json=args.json, format_report=format_table)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
