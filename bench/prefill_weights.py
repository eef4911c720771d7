"""Prefill weights side by side: dequantizing, dense copies, int8 GEMM codes (kept or per step).

Loads the model once with its quantized weights (the GGUF's own int4/int8 layers), fills its KV
cache with a `--tokens` prompt, then times, interleaved round by round on the same runner:

- a **prefill** step of `--tokens` tokens (a first-time prompt);
- a **scattered** step of a quarter of them at positions spread over the prompt (what a chunk-KV
  reuse blend computes: core/chunk_reuse.py);

each through the quantized layers as they run without copies (int4 kernel up to its token
limit, else dequantize + GEMM), through dense copies of their weights (one GEMM in the model
dtype) and through int8 codes of them (layers/int8_gemm.py: one integer GEMM), kept
("int8-kept") or made natively for each step ("int8", csrc/int8_row_codes.h), and, on CPUs with
AMX in bf16, kept in oneDNN's packed layout ("int8-packed"), as `EngineConfig.prefill_weights`
"quantized" / "dense" / "int8" run them (the last keeps the codes only where no native kernel
makes them, and packed on AMX). After a first untimed
pass, reports the median of `--rounds` per case, the speedups over "quantized", each copy's size
and build time, and each setting's perplexity on `--perplexity-tokens` of tests/data's SQuAD
passages (windows of 1,024, chunks of 256 tokens: the copies' path), the quality price. Random
token ids for the timed steps: the cost of a step does not depend on which tokens they are.

    python -m bench.prefill_weights                    # the default model, 768 tokens, 3 rounds
    python -m bench.prefill_weights --smoke            # the bundled model, 96 tokens, 1 round
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from harness import CannotRunError, chat_model_dir, cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL, DEFAULT_CHAT_MODEL

CASES = ("prefill", "scattered")
SETTINGS = ("quantized", "dense", "int8-kept", "int8")
# where the engine packs int8 codes (AMX, bf16), a fifth setting, a third copy
PACKED = "int8-packed"
QUALITY_TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "squad_passages.txt"
PERPLEXITY_WINDOW, PERPLEXITY_CHUNK = 1024, 256


def run_benchmark(
    model: str, models_dir: Path, num_tokens: int, rounds: int, perplexity_tokens: int
) -> dict:
    import torch

    from bench.perplexity import perplexity
    from inference.engine import BatchEntry, EngineConfig, ModelRunner
    from inference.engine.engine import _load_tokenizer
    from inference.engine.kernels import has_amx, has_int8_dot_products
    from inference.engine.layers.quantization import dense_weight_layers
    from inference.engine.model_runner import (
        INT8_CODES_PER_STEP_KERNEL_TOKENS,
        INT8_GEMM_KERNEL_TOKENS,
        dense_kernel_token_limit,
        packed_int8_kernel_tokens,
        packs_int8_gemm_weights,
    )

    model_dir = chat_model_dir(model, models_dir)
    config = EngineConfig(
        model_dir=model_dir,
        max_model_len=max(num_tokens, PERPLEXITY_WINDOW),
        kv_cache_mb=max(64, max(num_tokens, PERPLEXITY_WINDOW) // 8),
        prefill_weights="quantized",
    )
    runner = ModelRunner(config)
    layers = dense_weight_layers(runner.model, skip=(runner.model.lm_head,))
    if not layers:
        raise CannotRunError(f"{model} has no quantized layers: nothing to compare")
    if not all(layer.makes_int8_codes_natively for layer in layers):
        raise CannotRunError("the native kernels do not make int8 codes here (int8 per step)")
    settings = SETTINGS + ((PACKED,) if packs_int8_gemm_weights(runner.dtype) else ())
    limits = {"quantized": [layer.max_kernel_tokens for layer in layers]}
    copy_bytes, build_s, copies = {}, {}, {}
    for setting, limit in (
        ("dense", dense_kernel_token_limit()),
        ("int8-kept", INT8_GEMM_KERNEL_TOKENS),
        (PACKED, packed_int8_kernel_tokens(runner.model.args.hidden_size)),
    ):
        if setting not in settings:
            continue
        started = time.perf_counter()
        if setting == "dense":
            copy_bytes[setting] = sum(layer.keep_dense_weight(limit) for layer in layers)
            copies[setting] = [layer.dense_weight for layer in layers]
        else:
            copy_bytes[setting] = sum(
                layer.keep_int8_gemm_weight(limit, packed=setting == PACKED) for layer in layers
            )
            copies[setting] = [layer.int8_gemm_weight for layer in layers]
        build_s[setting] = time.perf_counter() - started
        limits[setting] = [limit] * len(layers)
        for layer, quantized_limit in zip(layers, limits["quantized"], strict=True):
            layer.max_kernel_tokens = quantized_limit
            layer.dense_weight, layer.int8_gemm_weight = None, None
    limits["int8"] = [INT8_CODES_PER_STEP_KERNEL_TOKENS] * len(layers)

    def use(setting: str) -> None:
        for i, (layer, limit) in enumerate(zip(layers, limits[setting], strict=True)):
            layer.dense_weight = copies["dense"][i] if setting == "dense" else None
            is_kept = setting in ("int8-kept", PACKED)
            layer.int8_gemm_weight = copies[setting][i] if is_kept else None
            layer.codes_int8_gemm_weight_per_step = setting == "int8"
            layer.max_kernel_tokens = limit

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
        for setting in settings:
            use(setting)
            runner.execute([entries[case]])
    seconds: dict[str, list[float]] = {}
    for _ in range(rounds):
        for case in CASES:
            for setting in settings:
                use(setting)
                began = time.perf_counter()
                runner.execute([entries[case]])
                seconds.setdefault(f"{case}/{setting}", []).append(time.perf_counter() - began)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    text_ids = _load_tokenizer(model_dir)(QUALITY_TEXT.read_text())["input_ids"]
    text_ids = text_ids[:perplexity_tokens]
    perplexities = {}
    for setting in settings:
        use(setting)
        perplexities[setting] = rounded(
            perplexity(runner, text_ids, window=PERPLEXITY_WINDOW, chunk=PERPLEXITY_CHUNK), 4
        )
    return {
        "model": model,
        "dtype": str(runner.dtype).removeprefix("torch."),
        "tokens": num_tokens,
        "scattered_tokens": len(positions),
        "rounds": rounds,
        "settings": list(settings),
        "copy_gib": {name: rounded(value / 2**30, 2) for name, value in copy_bytes.items()},
        "copy_build_s": {name: rounded(value, 1) for name, value in build_s.items()},
        "kernel_token_limit": {
            name: values[0] for name, values in limits.items() if name != "quantized"
        },
        "seconds": {name: rounded(value, 3) for name, value in medians.items()},
        "speedup": {
            f"{case}/{setting}": rounded(
                medians[f"{case}/quantized"] / medians[f"{case}/{setting}"], 2
            )
            for case in CASES
            for setting in settings[1:]
        },
        "perplexity_tokens": len(text_ids),
        "perplexity": perplexities,
        "amx": has_amx(),
        "int8_dot_products": has_int8_dot_products(),
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_name(),
    }


def format_table(report: dict) -> str:
    settings = report["settings"]
    lines = [
        f"Prefill weights, {report['model']} ({report['dtype']}), {report['tokens']}-token "
        f"prefill and a {report['scattered_tokens']}-token scattered step, median of "
        f"{report['rounds']} ({report['cpu']}, AMX: {report['amx']}, int8 dot products: "
        f"{report['int8_dot_products']}).",
        "",
        "| step | "
        + " | ".join(f"{name} s" for name in settings)
        + " | "
        + " | ".join(f"{name} speedup" for name in settings[1:])
        + " |",
        "|---|" + "---:|" * (2 * len(settings) - 1),
    ]
    seconds, speedup = report["seconds"], report["speedup"]
    for case in CASES:
        lines.append(
            f"| {case} | "
            + " | ".join(f"{seconds[f'{case}/{name}']:.3f}" for name in settings)
            + " | "
            + " | ".join(f"{speedup[f'{case}/{name}']:.2f}x" for name in settings[1:])
            + " |"
        )
    perplexity = report["perplexity"]
    lines += [
        "",
        f"Perplexity over {report['perplexity_tokens']} tokens: "
        + ", ".join(f"{name} {perplexity[name]:.4f}" for name in settings),
        "Copies: "
        + ", ".join(
            f"{name} {report['copy_gib'][name]} GiB (built in {report['copy_build_s'][name]} s)"
            for name in report["copy_gib"]
        ),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prefill_weights", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--model", default=None, help=f"default: {DEFAULT_CHAT_MODEL}")
    parser.add_argument("--tokens", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--perplexity-tokens", type=int, default=2048)
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="the bundled model, 96 tokens")
    args = parser.parse_args(argv)
    if args.smoke:
        # NOTE: above the token limit of the codes made per step (64), and so are the
        # perplexity's chunks (256 + 80 tokens): both int8 settings multiply the same codes
        args.model, args.tokens, args.rounds = args.model or BUNDLED_CHAT_MODEL, 96, 1
        args.perplexity_tokens = 336
    if args.tokens < 8 or args.rounds < 1 or args.perplexity_tokens < 2:
        parser.error("--tokens must be at least 8, --rounds 1 and --perplexity-tokens 2")
    models_dir = args.models_dir or default_models_dir()

    def run() -> dict:
        return run_benchmark(
            args.model or DEFAULT_CHAT_MODEL,
            models_dir,
            args.tokens,
            args.rounds,
            args.perplexity_tokens,
        )

    return run_cli(run, as_json=args.json, format_report=format_table, num_errors=lambda _: 0)


if __name__ == "__main__":
    raise SystemExit(main())
