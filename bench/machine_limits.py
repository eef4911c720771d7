"""What this machine allows a model to serve: measured peaks, and the tok/s limits they imply.

Measured on the spot, at the thread count the server's engine uses, since the machines are shared
and their neighbours move every figure (../shared/MEASUREMENTS.md has earlier readings):

- **memory read bandwidth**: the sum of a 512 MB float32 tensor (best of a few runs);
- **GEMM peaks**: `torch.matmul` of [2048, 2304] @ [2304, 1536] in bfloat16 and float32, and
  `torch._int_mm` of int8 operands of the same shape (None where this torch cannot run it).

From them and a model's shape (`ModelShape`), two limits on output tok/s:

- **decode** (one stream): every decode step reads the weights once, so a stream cannot pass
  bandwidth / weight bytes read per token; N streams batched into one step share that read, so N
  streams together cannot pass N times it;
- **compute**: every computed token (prompt tokens not served from the prefix cache, and output
  tokens) costs 2 x non-embedding parameters FLOPs in the linear layers, and every output token
  2 x vocab x hidden more in the logits; at a GEMM peak the output rate cannot pass
  peak / (FLOPs per output token). Attention is left out, so it is a bound from above.

The applicable limit of a level is the lower of the two, the compute side taken at the faster of
the engine dtype's GEMM peak and the int8 one (the GGUF formats hold int8/int4 weights).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from harness import rounded

READ_BYTES = 512 * 2**20
GEMM_SHAPE = (2048, 2304, 1536)  # [m, k] @ [k, n], as ../shared/MEASUREMENTS.md measured
REPEATS = 5
INT8_RANGE = 64  # operand values in [-64, 64): no int32 overflow at any k measured here


@dataclass(frozen=True, slots=True)
class MachineLimits:
    threads: int
    read_gb_s: float
    bf16_gflop_s: float
    fp32_gflop_s: float
    int8_gop_s: float | None  # None: torch._int_mm does not run here

    def float_gflop_s(self, dtype: str) -> float:
        """The GEMM peak of the engine's activation dtype ("bfloat16", "float32"...)."""
        return self.fp32_gflop_s if dtype == "float32" else self.bf16_gflop_s

    def to_json(self) -> dict:
        return {
            key: rounded(value, 2) if isinstance(value, float) else value
            for key, value in asdict(self).items()
        }


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the limits need of a model, as the engine loads it."""

    non_embedding_params: int  # every parameter but the embedding table and the logits head
    lm_head_params: int  # vocab x hidden
    weight_bytes_per_token: int  # what one decode step reads: all weights but the embedding's

    def linear_flops(self, computed_tokens: float, output_tokens: float) -> float:
        return 2 * self.non_embedding_params * computed_tokens + (
            2 * self.lm_head_params * output_tokens
        )


# --- The arithmetic ---


def decode_limit_tok_s(read_gb_s: float, shape: ModelShape) -> float:
    """One stream's decode limit: bandwidth / bytes of weights read per token."""
    return read_gb_s * 1e9 / shape.weight_bytes_per_token


def compute_limit_tok_s(
    gflop_s: float, shape: ModelShape, new_prompt_tokens: float, output_tokens: float
) -> float:
    """Output tok/s if each request's linear-layer FLOPs ran at `gflop_s`.

    `new_prompt_tokens`: the prompt tokens a request computes (not served from the prefix
    cache); `output_tokens`: the tokens it generates.
    """
    flops = shape.linear_flops(new_prompt_tokens + output_tokens, output_tokens)
    return gflop_s * 1e9 * output_tokens / flops


def level_limits(
    limits: MachineLimits,
    shape: ModelShape,
    *,
    dtype: str,
    concurrency: int,
    new_prompt_tokens: float,
    output_tokens: float,
) -> dict:
    """The limits of `concurrency` streams of this shape on this machine (see the module doc)."""
    decode = decode_limit_tok_s(limits.read_gb_s, shape)

    def compute(gflop_s: float | None) -> float | None:
        if gflop_s is None:
            return None
        return compute_limit_tok_s(gflop_s, shape, new_prompt_tokens, output_tokens)

    bandwidth = concurrency * decode
    float_peak = limits.float_gflop_s(dtype)
    best_peak = max(float_peak, limits.int8_gop_s or 0.0)
    compute_best = compute(best_peak)
    return {
        "decode_limit_tok_s": decode,
        "bandwidth_limit_tok_s": bandwidth,
        "compute_limit_bf16_tok_s": compute(limits.bf16_gflop_s),
        "compute_limit_int8_tok_s": compute(limits.int8_gop_s),
        "compute_limit_fp32_tok_s": compute(limits.fp32_gflop_s),
        "limit_tok_s": min(bandwidth, compute_best),
        "bound": "bandwidth" if bandwidth <= compute_best else "compute",
        "new_prompt_tokens": new_prompt_tokens,
    }


def shares_of(throughput_tok_s: float | None, limits: dict) -> dict:
    """Output tok/s as a share of each limit of `level_limits` (None where either is missing)."""

    def share(key: str) -> float | None:
        limit = limits[key]
        return throughput_tok_s / limit if throughput_tok_s and limit else None

    return {
        "share_of_limit": share("limit_tok_s"),
        "share_of_bandwidth_limit": share("bandwidth_limit_tok_s"),
        "share_of_compute_bf16": share("compute_limit_bf16_tok_s"),
        "share_of_compute_int8": share("compute_limit_int8_tok_s"),
    }


# --- The measurements ---


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls, after one untimed call (allocations, packing)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
    return best


def read_gb_s(num_bytes: int = READ_BYTES, repeats: int = REPEATS) -> float:
    """Memory read bandwidth: the sum of a float32 tensor of `num_bytes`."""
    values = torch.ones(num_bytes // 4, dtype=torch.float32)
    return values.numel() * 4 / best_seconds(values.sum, repeats) / 1e9


def gemm_gflop_s(
    dtype: torch.dtype, shape: tuple[int, int, int] = GEMM_SHAPE, repeats: int = REPEATS
) -> float:
    """`torch.matmul` of [m, k] @ [k, n] in `dtype`, GFLOP/s."""
    m, k, n = shape
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    return 2 * m * k * n / best_seconds(lambda: torch.matmul(a, b), repeats) / 1e9


def int8_gemm_gop_s(
    shape: tuple[int, int, int] = GEMM_SHAPE, repeats: int = REPEATS
) -> float | None:
    """`torch._int_mm` (int8 @ int8 -> int32) of [m, k] @ [k, n], GOP/s; None where it does
    not run (torch builds and CPUs without it raise)."""
    m, k, n = shape
    a = torch.randint(-INT8_RANGE, INT8_RANGE, (m, k), dtype=torch.int8)
    b = torch.randint(-INT8_RANGE, INT8_RANGE, (k, n), dtype=torch.int8)
    try:
        seconds = best_seconds(lambda: torch._int_mm(a, b), repeats)
    except (RuntimeError, NotImplementedError):
        return None
    return 2 * m * k * n / seconds / 1e9


@contextmanager
def torch_threads(threads: int | None) -> Iterator[int]:
    """torch's thread count set to `threads` (None or 0: left as it is) for the block."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def measure_machine_limits(
    threads: int | None = None,
    *,
    read_bytes: int = READ_BYTES,
    gemm_shape: tuple[int, int, int] = GEMM_SHAPE,
    repeats: int = REPEATS,
) -> MachineLimits:
    """Bandwidth and GEMM peaks at `threads` torch threads (None or 0: torch's default)."""
    with torch_threads(threads) as used:
        return MachineLimits(
            threads=used,
            read_gb_s=read_gb_s(read_bytes, repeats),
            bf16_gflop_s=gemm_gflop_s(torch.bfloat16, gemm_shape, repeats),
            fp32_gflop_s=gemm_gflop_s(torch.float32, gemm_shape, repeats),
            int8_gop_s=int8_gemm_gop_s(gemm_shape, repeats),
        )
