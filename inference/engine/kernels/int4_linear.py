"""The native int4 matmul (`csrc/int4_linear.c`), its weight format and layout.

`quantization.Int4Linear` uses this format when the kernel can run (a CPU with one of the
kernels' instruction sets, a bf16 or float32 model) and PyTorch's int4 CPU format otherwise.

Format: per group of `group_size` input columns and output row, a bf16 scale s and a uint8
zero point z in sixteenths of s: w = s (q - z / 16) for codes q in [0, 15]. PyTorch's format
keeps a bf16 zero (the group's minimum) instead: 4 bytes a group where this takes 3, so int4
weights are 4.75 bits each instead of 5 (SmolLM2-135M: 34.0% of bf16 instead of 35.2%). Scale
and zero point are fitted to each group by least squares (`quantize_int4_vnni`), which makes up
for the zero point's grid: SmolLM2-135M's perplexity on tests/data's text moves +0.48% from bf16
(+0.36% in PyTorch's format; +0.74% with plain min/max groups on the grid), and greedy answers
agree with bf16's more often (tests/engine/test_quality.py). A group's range always includes 0
(every group of SmolLM2's weights straddles it: its minimum sits 0.6 to 14.6 steps below zero),
so z fits a byte; a one-signed group is widened to reach 0.

Layout: codes by tiles of 64 output rows, each [K/8][64][4] bytes; byte b of row r at step j
holds column 8j + b in its low nibble and column 8j + 4 + b in its high nibble.

Numerics: activations are quantized per token to two int8 codes per value in blocks of 32
(see the kernel), the sums are float32, the output of the activations' dtype; results match the
dequantized weights to bf16 rounding (tests/engine/kernels/test_int4_linear.py).
"""

from __future__ import annotations

import ctypes

import torch

from inference.engine.kernels import KernelFunction, require
from inference.engine.kernels.weight_matmul import (
    WeightMatmul,
    dequantize_packed_transposed,
    int8_codes_packed_transposed,
)

TILE_ROWS = 64  # csrc: TILE_ROWS
BLOCK = 32  # activation columns per int8 block (csrc: BLOCK)
# NOTE: up to here the kernel beats dequantizing (natively: `dequantize_transposed`) + the GEMM.
# The kernel is compute-bound from ~8 tokens (each token's two activation codes cost their own
# integer dot products: ~200-270 GMAC/s on 2 Zen 4 cores) while the bf16 GEMM reaches ~400;
# the two interleaved in one process on Qwen2.5-1.5B's shapes (Zen 4, bf16), kernel time over
# dequantize + GEMM: 0.4-0.5 at 32-64 tokens, 0.64-0.78 at 128, 0.85-0.93 at 256; at 512 the
# GEMM path wins by 1.2-1.5x (python -m bench.quantized_matmul). Measured on that CPU class
# only, not yet on a float32 AVX2 machine.
MAX_TOKENS = 256


_matmul = KernelFunction(
    "int4_linear", "int4_linear", [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_int]
)


_dequantize = KernelFunction(
    "int4_linear",
    "int4_dequantize",
    [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5 + [ctypes.c_int],
)

_int8_codes = KernelFunction(
    "int4_linear",
    "int4_int8_codes",
    [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_int],
)


def is_supported(
    in_features: int,
    group_size: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> bool:
    """Whether the kernel can serve an int4 weight of `in_features` columns in groups of
    `group_size`, for a `dtype` model on `device` (bf16 or float32, on a CPU the kernels run on)."""
    return (
        torch.device(device).type == "cpu"
        and in_features % BLOCK == 0
        and group_size % BLOCK == 0
        and _matmul(dtype) is not None
    )


FIT_ROUNDS = 2


def quantize_int4_vnni(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float weights [rows, num_groups, group_size] -> (codes [rows, num_groups, group_size]
    uint8, scales [num_groups, rows] bf16, zero points [num_groups, rows] uint8)."""
    low = groups.amin(dim=-1).clamp(max=0)
    high = groups.amax(dim=-1).clamp(min=0)
    scales = ((high - low) / 15).clamp(min=1e-12).to(torch.bfloat16)
    step = scales.float()
    zero_points = torch.round(-low / step * 16).clamp(0, 255)
    codes = torch.round(groups / step[..., None] + zero_points[..., None] / 16).clamp(0, 15)
    # NOTE: min/max groups on the grids first, then the least-squares fit (converged after two
    # rounds on SmolLM2-135M: four gave the same perplexity).
    for _ in range(FIT_ROUNDS):
        # least squares w ~ s q + m for these codes, then the codes for the rounded (s, m)
        q_mean, w_mean = codes.mean(dim=-1), groups.mean(dim=-1)
        q_centered = codes - q_mean[..., None]
        variance = (q_centered * q_centered).sum(dim=-1)
        fitted_step = (q_centered * groups).sum(dim=-1) / variance.clamp(min=1e-12)
        fitted_step = torch.where(variance > 0, fitted_step, step).clamp(min=1e-12)
        scales = fitted_step.to(torch.bfloat16)
        step = scales.float()
        offset = w_mean - fitted_step * q_mean  # m = -s z / 16
        zero_points = torch.round(-offset / step * 16).clamp(0, 255)
        codes = torch.round(groups / step[..., None] + zero_points[..., None] / 16).clamp(0, 15)
    return (
        codes.to(torch.uint8),
        scales.T.contiguous(),
        zero_points.to(torch.uint8).T.contiguous(),
    )


def pack_int4_vnni(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] in the kernel's layout from int4 codes [N, K] (N a multiple of 64)."""
    num_rows, num_cols = codes.shape
    codes = codes.to(torch.uint8).contiguous()
    out = torch.empty(num_rows, num_cols // 2, dtype=torch.uint8)
    # NOTE: tiles are independent, so a large table is packed a few MB at a time (its int32
    # temporaries would be as large as the result), and the 4 bytes of a step are handled as
    # one int32 (codes < 16: a shift by 4 stays inside each byte), 4x faster than byte by byte.
    rows_per_chunk = max(TILE_ROWS, (1 << 22) // max(num_cols, 1) // TILE_ROWS * TILE_ROWS)
    for start in range(0, num_rows, rows_per_chunk):
        end = min(start + rows_per_chunk, num_rows)
        words = codes[start:end].view(torch.int32)
        steps = words.view((end - start) // TILE_ROWS, TILE_ROWS, num_cols // 8, 2)
        packed = steps[..., 1] << 4
        packed |= steps[..., 0]  # [tiles, 64, K/8] words of 4 bytes
        destination = out[start:end].view(torch.int32).view(-1, num_cols // 8, TILE_ROWS)
        destination.copy_(packed.transpose(1, 2))
    return out


def unpack_int4_vnni(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_int4_vnni`: uint8 codes [N, K]."""
    num_rows, half_cols = packed.shape
    tiles = packed.view(num_rows // TILE_ROWS, half_cols // 4, TILE_ROWS, 4).transpose(1, 2)
    return _split_nibbles(tiles).reshape(num_rows, 2 * half_cols)


def unpack_int4_vnni_rows(packed: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """uint8 codes [len(row_ids), K] of the rows `row_ids` (1-d) of a packed weight."""
    num_rows, half_cols = packed.shape
    tiles = packed.view(num_rows // TILE_ROWS, half_cols // 4, TILE_ROWS, 4)
    rows = tiles[row_ids // TILE_ROWS, :, row_ids % TILE_ROWS]  # [ids, K/8, 4]
    return _split_nibbles(rows).reshape(len(row_ids), 2 * half_cols)


def _split_nibbles(steps: torch.Tensor) -> torch.Tensor:
    """[..., K/8, 4] bytes -> [..., K/8, 2, 4] codes (low nibbles first)."""
    return torch.stack((steps & 15, steps >> 4), dim=-2)


def int4_matmul(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    group_size: int,
    out_features: int,
    dtype: torch.dtype = torch.bfloat16,
) -> WeightMatmul:
    """x [M, K] (contiguous, of `dtype`) times a packed int4 weight -> [M, out_features]."""
    return WeightMatmul(
        require(_matmul(dtype), "int4_linear"),
        (codes, scales, zero_points),
        name="int4",
        in_features=codes.shape[1] * 2,
        out_features=out_features,
        padded_out_features=codes.shape[0],
        dtype=dtype,
        extra_sizes=(group_size,),
    )


def dequantize_transposed(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    group_size: int,
    start: int,
    end: int,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Rows [start, end) of a packed int4 weight as W^T [K, end - start] in `dtype` (`start` a
    multiple of 64), the same values as dequantizing with PyTorch ops, or None where the native
    kernel cannot run (the caller then dequantizes with PyTorch ops)."""
    kernel = _dequantize(dtype)
    if kernel is None:
        return None
    return dequantize_packed_transposed(
        kernel,
        (codes, scales, zero_points),
        name="int4",
        start=start,
        end=end,
        in_features=codes.shape[1] * 2,
        dtype=dtype,
        extra_sizes=(group_size,),
    )


def int8_codes_transposed(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    group_size: int,
    start: int,
    end: int,
    dtype: torch.dtype,
    *,
    scratch: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows [start, end) of a packed int4 weight (`start` a multiple of 64) as int8 codes W^T
    [K, end - start] and float32 scales, one per row: `Int8GemmWeight.from_rows` of the rows
    in float32, bit for bit; None where the native kernel cannot run. `scratch`: codes for one
    step, in a buffer the next such call overwrites (`int8_codes_packed_transposed`)."""
    kernel = _int8_codes(dtype)
    if kernel is None:
        return None
    return int8_codes_packed_transposed(
        kernel,
        (codes, scales, zero_points),
        name="int4",
        start=start,
        end=end,
        in_features=codes.shape[1] * 2,
        extra_sizes=(group_size,),
        scratch=scratch,
    )
