"""Decode speed at each instruction-set level of the native kernels, against PyTorch alone.

For each model (default: the catalogue's default model and the bundled one), served as Cachet
serves it here (dtype "auto": bf16 where the CPU has native bf16, float32 elsewhere;
quantization as asked, default "auto": a GGUF's own formats), one row per configuration, each
in a fresh process:

- `pytorch`: `native_kernels=False`, the baseline every ratio is taken against;
- one row per level this CPU can run (kernels/__init__.py's ISA_LEVELS, forced with
  $CACHET_KERNEL_ISA), the best first: what a CPU of that class gets from the same code.

Columns: single-stream decode tok/s, throughput at 8 concurrent, cold TTFT (bench.workload's
prompts, shortened so that PyTorch's prefill does not dominate the run: a 256-token system
prompt, a 64-token user turn, 64 greedy tokens), whether the decode step ran as one fused native
call, and each speed over PyTorch's.

    python -m bench.kernel_levels                          # the default models
    python -m bench.kernel_levels --model smollm2-135m-instruct --json
    python -m bench.kernel_levels --smoke                  # the bundled model, tiny sizes,
                                                           # PyTorch and the best level only
    python -m bench.kernel_levels --levels avx512_vnni,avx512   # two levels side by side
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench.engine import configuration_engine_config, measure_speed
from bench.fresh_process import child_arguments, report_to_parent, run_in_fresh_process
from bench.workload import Seeds, Workload
from harness import CannotRunError, cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL, DEFAULT_CHAT_MODEL

logger = logging.getLogger(__name__)

WORKLOAD = Workload(system_tokens=256, user_tokens=64, output_tokens=64, concurrency=(8,))
SMOKE_WORKLOAD = Workload(system_tokens=48, user_tokens=16, output_tokens=8, concurrency=(2,))
BASELINE = "pytorch"


def run_benchmark(
    *,
    models: Sequence[str],
    quantization: str,
    models_dir: Path,
    smoke: bool = False,
    configurations: Sequence[str] | None = None,
) -> dict:
    """`configurations`: the rows to run ("pytorch" and levels this CPU runs, in that order);
    None: all (smoke: PyTorch and the best level)."""
    from inference.engine.kernels import ISA_ENVIRONMENT_VARIABLE, supported_isa_levels
    from inference.model_files import ModelSourceError, resolve_chat_model

    levels = [level.name for level in supported_isa_levels()]
    if configurations is None:
        # NOTE: smoke: PyTorch and the best level only
        configurations = [BASELINE, *(levels[:1] if smoke else levels)]
    unknown = [c for c in configurations if c != BASELINE and c not in levels]
    if unknown:
        raise CannotRunError(
            f"not a level this CPU runs: {', '.join(unknown)}; it runs {', '.join(levels)}"
        )
    workload = SMOKE_WORKLOAD if smoke else WORKLOAD
    rows = []
    for name in models:
        try:
            model_dir = resolve_chat_model(name, models_dir).directory
        except ModelSourceError as error:
            raise CannotRunError(f"model {name}: {error}") from None
        baseline: dict | None = None
        for configuration in configurations:
            arguments = {
                "model": name,
                "model_dir": str(model_dir),
                "quantization": quantization,
                "native_kernels": configuration != BASELINE,
                "workload": asdict(workload),
            }
            environment = (
                {} if configuration == BASELINE else {ISA_ENVIRONMENT_VARIABLE: configuration}
            )
            label = f"{name} / {configuration}"
            try:
                row = run_in_fresh_process(
                    "bench.kernel_levels", arguments, label=label, environment=environment
                )
            except CannotRunError as error:
                logger.error("%s", error)
                row = {"error": str(error).splitlines()[-1]}
            row = {"model": name, "kernels": configuration, **row}
            if configuration == BASELINE and "error" not in row:
                baseline = row
            elif baseline is not None and "error" not in row:
                for key in ("decode_tok_s", "concurrent_tok_s"):
                    row[f"{key}_over_pytorch"] = rounded(row[key] / baseline[key], 2)
            logger.info("%s: %s", label, row)
            rows.append(row)
    return {
        "config": {
            "cpu": cpu_name(),
            "levels": levels,
            "quantization": quantization,
            "workload": asdict(workload),
        },
        "results": rows,
    }


def measure(arguments: dict) -> dict:
    """A child's work: build the engine as configured and measure its speed."""
    import torch

    from inference.engine import Engine

    workload = Workload.from_json(arguments["workload"])
    config = configuration_engine_config(
        Path(arguments["model_dir"]),
        quantization=arguments["quantization"],
        native_kernels=arguments["native_kernels"],
    )
    started = time.perf_counter()
    engine = Engine(config)
    load_s = time.perf_counter() - started
    try:
        speed = measure_speed(engine, workload, Seeds())
        return {
            "dtype": str(engine.config.dtype).removeprefix("torch."),
            "fused_decode": engine.runner.model.fused_decode is not None,
            "load_s": rounded(load_s, 1),
            "torch_threads": torch.get_num_threads(),
            "decode_tok_s": speed["decode_tok_s"],
            "concurrent_tok_s": speed["throughput_tok_s"][str(workload.concurrency[0])],
            "cold_ttft_s": speed["cold_ttft_s"],
        }
    finally:
        engine.shutdown()


def format_table(report: dict) -> str:
    config = report["config"]
    concurrency = config["workload"]["concurrency"][0]
    lines = [
        f"CPU: {config['cpu']}; levels it runs: {', '.join(config['levels']) or 'none'}; "
        f"quantization {config['quantization']}.",
        "",
        f"| model | kernels | dtype | fused decode | single-stream tok/s (x PyTorch) | "
        f"{concurrency}-concurrent tok/s (x PyTorch) | cold TTFT s |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for row in report["results"]:
        if "error" in row:
            lines.append(
                f"| {row['model']} | {row['kernels']} | failed: {row['error']} |" + " |" * 4
            )
            continue
        lines.append(
            f"| {row['model']} | {row['kernels']} | {row['dtype']} | "
            f"{'yes' if row['fused_decode'] else 'no'} | "
            f"{row['decode_tok_s']:.1f}{_ratio(row, 'decode_tok_s')} | "
            f"{row['concurrent_tok_s']:.1f}{_ratio(row, 'concurrent_tok_s')} | "
            f"{row['cold_ttft_s']:.2f} |"
        )
    return "\n".join(lines)


def _ratio(row: dict, key: str) -> str:
    ratio = row.get(f"{key}_over_pytorch")
    return "" if ratio is None else f" ({ratio:.2f}x)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kernel_levels", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--model", action="append", help="repeat (default: the default models)")
    parser.add_argument("--quantization", default="auto", help="default: auto")
    parser.add_argument("--models-dir", type=Path, default=None, help="default: the data dir's")
    parser.add_argument("--smoke", action="store_true", help="the bundled model, tiny sizes")
    parser.add_argument(
        "--levels",
        help="the rows to run, comma-separated: pytorch and levels this CPU runs (default: all); "
        "ratios are over pytorch where it runs",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        logging.basicConfig(level=logging.WARNING)
        report_to_parent(measure(child_arguments(args.child)))
        return 0
    default_models = (
        [BUNDLED_CHAT_MODEL] if args.smoke else [DEFAULT_CHAT_MODEL, BUNDLED_CHAT_MODEL]
    )
    models_dir = args.models_dir or default_models_dir()

    def run() -> dict:
        return run_benchmark(
            models=args.model or default_models,
            quantization=args.quantization,
            models_dir=models_dir,
            smoke=args.smoke,
            configurations=args.levels.split(",") if args.levels else None,
        )

    return run_cli(run, as_json=args.json, format_report=format_table)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
