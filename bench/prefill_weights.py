"""Dense prefill weights against dequantizing: one model's prefill-sized steps, side by side.

Loads the model once with its quantized weights (the GGUF's own int4/int8 layers), fills its KV
cache with a `--tokens` prompt, then times, interleaved round by round on the same runner:

- a **prefill** step of `--tokens` tokens (a first-time prompt);
- a **scattered** step of a quarter of them at positions spread over the prompt (what a chunk-KV
  reuse blend computes: core/chunk_reuse.py);

each through the quantized layers as they run without dense weights (int4 kernel up to its token
limit, else dequantize + GEMM) and through dense copies of their weights
(`ModelRunner._keep_dense_prefill_weights`: one GEMM). After a first untimed pass, reports the
median of `--rounds` per case, the speedups, and the dense copies' size and build time. Random
token ids: the cost of a step does not depend on which tokens they are.

    python -m bench.prefill_weights                    # the default model, 768 tokens, 3 rounds
    python -m bench.prefill_weights --smoke            # the bundled model, 64 tokens, 1 round
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from harness import CannotRunError, cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL, DEFAULT_CHAT_MODEL

CASES = ("prefill", "scattered")


def run_benchmark(model: str, models_dir: Path, num_tokens: int, rounds: int) -> dict:
    import torch

    from inference.engine import BatchEntry, EngineConfig, ModelRunner
    from inference.engine.kernels import has_amx
    from inference.engine.layers.quantization import dense_weight_layers
    from inference.engine.model_runner import dense_kernel_token_limit
    from inference.model_files import ModelSourceError, resolve_chat_model

    try:
        resolved = resolve_chat_model(model, models_dir)
    except ModelSourceError as error:
        raise CannotRunError(f"model {model}: {error}") from None
    config = EngineConfig(
        model_dir=resolved.directory,
        max_model_len=max(num_tokens, 64),
        kv_cache_mb=max(64, num_tokens // 8),
        prefill_weights="quantized",
    )
    runner = ModelRunner(config)
    layers = dense_weight_layers(runner.model, skip=(runner.model.lm_head,))
    if not layers:
        raise CannotRunError(f"{model} has no quantized layers: nothing to compare")
    quantized_limits = [layer.max_kernel_tokens for layer in layers]
    started = time.perf_counter()
    dense_limit = dense_kernel_token_limit()
    dense_bytes = sum(layer.keep_dense_weight(dense_limit) for layer in layers)
    build_s = time.perf_counter() - started
    dense_weights = [layer.dense_weight_t for layer in layers]

    def use(setting: str) -> None:
        for layer, limit, weight in zip(layers, quantized_limits, dense_weights, strict=True):
            is_dense = setting == "dense"
            layer.dense_weight_t = weight if is_dense else None
            layer.max_kernel_tokens = dense_limit if is_dense else limit

    rng = random.Random(0)
    tokens = [rng.randrange(100, 10_000) for _ in range(num_tokens)]
    block_table = list(range(-(-num_tokens // config.block_size)))
    runner.execute([BatchEntry(tokens, 0, block_table)])  # the cache the scattered step reads
    positions = sorted(rng.sample(range(num_tokens - 1), max(1, num_tokens // 4) - 1))
    positions.append(num_tokens - 1)
    entries = {
        "prefill": BatchEntry(tokens, 0, block_table),
        "scattered": BatchEntry(
            [tokens[p] for p in positions], positions[0], block_table, positions=positions
        ),
    }
    for case in CASES:  # NOTE: untimed: oneDNN prepares each GEMM shape on its first call
        for setting in ("quantized", "dense"):
            use(setting)
            runner.execute([entries[case]])
    seconds: dict[str, list[float]] = {}
    for _ in range(rounds):
        for case in CASES:
            for setting in ("quantized", "dense"):
                use(setting)
                began = time.perf_counter()
                runner.execute([entries[case]])
                seconds.setdefault(f"{case}/{setting}", []).append(time.perf_counter() - began)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        "model": model,
        "dtype": str(runner.dtype).removeprefix("torch."),
        "tokens": num_tokens,
        "scattered_tokens": len(positions),
        "rounds": rounds,
        "dense_gib": rounded(dense_bytes / 2**30, 2),
        "dense_build_s": rounded(build_s, 1),
        "dense_kernel_token_limit": dense_limit,
        "seconds": {name: rounded(value, 3) for name, value in medians.items()},
        "speedup": {
            case: rounded(medians[f"{case}/quantized"] / medians[f"{case}/dense"], 2)
            for case in CASES
        },
        "amx": has_amx(),
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_name(),
    }


def format_table(report: dict) -> str:
    lines = [
        f"Prefill weights, {report['model']} ({report['dtype']}), {report['tokens']}-token "
        f"prefill and a {report['scattered_tokens']}-token scattered step, median of "
        f"{report['rounds']} ({report['cpu']}, AMX: {report['amx']}).",
        "",
        "| step | quantized s | dense s | speedup |",
        "|---|---:|---:|---:|",
    ]
    for case in CASES:
        lines.append(
            f"| {case} | {report['seconds'][f'{case}/quantized']:.3f} | "
            f"{report['seconds'][f'{case}/dense']:.3f} | {report['speedup'][case]:.2f}x |"
        )
    lines.append(
        f"\nDense copies: {report['dense_gib']} GiB, built in {report['dense_build_s']} s."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prefill_weights", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--model", default=None, help=f"default: {DEFAULT_CHAT_MODEL}")
    parser.add_argument("--tokens", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="the bundled model, 64 tokens")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.tokens, args.rounds = args.model or BUNDLED_CHAT_MODEL, 64, 1
    if args.tokens < 8 or args.rounds < 1:
        parser.error("--tokens must be at least 8 and --rounds at least 1")
    models_dir = args.models_dir or default_models_dir()

    def run() -> dict:
        return run_benchmark(args.model or DEFAULT_CHAT_MODEL, models_dir, args.tokens, args.rounds)

    return run_cli(run, as_json=args.json, format_report=format_table, num_errors=lambda _: 0)


if __name__ == "__main__":
    raise SystemExit(main())
