"""Quantized matmuls by tokens per step: the native kernels against dequantizing, and GEMM speed.

For each weight shape of a model's decoder layer (default: Qwen2.5-Coder-1.5B's) and each number
of tokens in a step, in the activation dtype Cachet uses on this CPU ("auto": bf16 where it is
native, float32 elsewhere), three ways to compute x W^T for an int4 (and int8) weight:

- `kernel`: the native kernel on the packed weight (kernels/int4_linear.c, int8_linear.c);
- `dequantize`: dequantizing W (a chunk of rows at a time) and PyTorch's GEMM, the layers'
  path above the kernel's token limit;
- `dense`: PyTorch's GEMM on a weight already held in the activation dtype, what the same step
  costs a model kept unquantized: the "GEMM speed" the quantized paths are held against.

Each cell: milliseconds per call (the median of repeats) and GMAC/s; the table shows each
quantized way's time over `dense`, so a ratio below 1 is faster than the unquantized model.

    python -m bench.quantized_matmul                 # int4 and int8, 1..512 tokens
    python -m bench.quantized_matmul --json --quantization int4
    python -m bench.quantized_matmul --smoke         # tiny shapes, two token counts
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from harness import cpu_name, rounded, run_cli

# Qwen2.5-Coder-1.5B: hidden 1536, 12 query and 2 key/value heads of 128, MLP 8960 (out, in)
LAYER_SHAPES = {
    "qkv": (2048, 1536),
    "o": (1536, 1536),
    "gate_up": (17920, 1536),
    "down": (1536, 8960),
}
TOKENS = (1, 8, 32, 128, 512)
SMOKE_SHAPES = {"o": (256, 256)}
SMOKE_TOKENS = (1, 16)
WAYS = ("kernel", "dequantize", "dense")
MIN_SECONDS = 0.3  # per cell: enough repeats for a stable median


def time_call(call: Callable[[], object], min_seconds: float) -> float:
    """The median seconds of one call, over repeats that together take `min_seconds`."""
    call()  # warm: builds, first-touch pages
    times: list[float] = []
    start = time.perf_counter()
    while not times or time.perf_counter() - start < min_seconds:
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def quantized_layer(method: str, out_features: int, in_features: int, dtype: torch.dtype):
    from inference.engine.layers.quantization import quantize_linear

    linear = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        linear.weight.normal_(0.0, 0.02)
    layer = quantize_linear(linear.to(dtype), method, 128)
    if not layer.is_native:
        raise RuntimeError(f"no native {method} kernel for [{out_features}, {in_features}] here")
    return layer


def matmul_calls(layer, x: torch.Tensor, dense: torch.Tensor) -> dict[str, Callable[[], object]]:
    """Each way of computing x W^T (see the module docstring)."""
    return {
        "kernel": lambda: layer.kernel_matmul(x),
        "dequantize": lambda: layer.dequantized_matmul(x),
        "dense": lambda: torch.nn.functional.linear(x, dense),
    }


def run_benchmark(
    *,
    quantizations: Sequence[str],
    shapes: dict[str, tuple[int, int]],
    tokens: Sequence[int],
    min_seconds: float,
) -> dict:
    from inference.engine.config import resolve_auto_dtype
    from inference.engine.kernels import isa_level

    dtype = resolve_auto_dtype()
    rows = []
    for method in quantizations:
        for name, (out_features, in_features) in shapes.items():
            layer = quantized_layer(method, out_features, in_features, dtype)
            dense = layer.dequantize_rows(0, out_features, dtype)
            for num_tokens in tokens:
                x = torch.randn(num_tokens, in_features).to(dtype)
                calls = matmul_calls(layer, x, dense)
                macs = num_tokens * out_features * in_features
                row: dict = {
                    "quantization": method,
                    "weight": name,
                    "shape": [out_features, in_features],
                    "tokens": num_tokens,
                }
                for way in WAYS:
                    seconds = time_call(calls[way], min_seconds)
                    row[f"{way}_ms"] = rounded(seconds * 1000)
                    row[f"{way}_gmac_s"] = rounded(macs / seconds / 1e9, 1)
                rows.append(row)
    level = isa_level()
    return {
        "config": {
            "cpu": cpu_name(),
            "kernel_isa": None if level is None else level.name,
            "dtype": str(dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
        },
        "results": rows,
    }


def format_table(report: dict) -> str:
    config = report["config"]
    lines = [
        f"Quantized matmuls on {config['cpu']} ({config['kernel_isa']} kernels, "
        f"{config['dtype']} activations, {config['torch_threads']} threads): ms per call "
        "(GMAC/s), and each quantized way's time over the dense GEMM's",
        "",
        "| quantization | weight [out, in] | tokens | kernel | dequantize + GEMM | dense GEMM |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        dense_ms = row["dense_ms"]

        def cell(way: str, dense_ms: float = dense_ms, row: dict = row) -> str:
            ratio = f", {row[f'{way}_ms'] / dense_ms:.2f}x" if way != "dense" else ""
            return f"{row[f'{way}_ms']:.3f} ({row[f'{way}_gmac_s']:.0f}{ratio})"

        out_features, in_features = row["shape"]
        lines.append(
            f"| {row['quantization']} | {row['weight']} [{out_features}, {in_features}] | "
            f"{row['tokens']} | {cell('kernel')} | {cell('dequantize')} | {cell('dense')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.quantized_matmul", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument(
        "--quantization", action="append", choices=("int4", "int8"), help="default: both"
    )
    parser.add_argument(
        "--tokens", type=int, action="append", help=f"repeat (default: {list(TOKENS)})"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, two token counts")
    args = parser.parse_args(argv)

    def run() -> dict:
        return run_benchmark(
            quantizations=args.quantization or ["int4", "int8"],
            shapes=SMOKE_SHAPES if args.smoke else LAYER_SHAPES,
            tokens=args.tokens or (SMOKE_TOKENS if args.smoke else TOKENS),
            min_seconds=0.02 if args.smoke else MIN_SECONDS,
        )

    return run_cli(run, as_json=args.json, format_report=format_table)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
