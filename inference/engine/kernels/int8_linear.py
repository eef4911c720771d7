"""The native int8 matmul (`csrc/int8_linear.c`) and its weight layout.

`quantization.Int8Linear` keeps its codes (int8, one scale per output row) in this layout when
the kernel can run (a CPU with one of the kernels' instruction sets, a bf16 or float32 model),
and row-major for PyTorch's `_weight_int8pack_mm` otherwise. The values are the same; only the
order of the bytes differs, and the rows are padded with zeros to a multiple of 64.

Layout: codes by tiles of 64 output rows, each [K/4][64][4] bytes: the 4 bytes of row r at step
j are columns 4j..4j+3 (one 64-byte load: 16 rows x 4 columns).

Numerics: activations are quantized per token to two int8 codes per value in blocks of 32 (as for
the int4 kernel), the sums are exact integers scaled in float32; results match the dequantized
weights to the output dtype's rounding (tests/engine/kernels/test_int8_linear.py).
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
STEP = 4  # columns per row and step (csrc: STEP)
# NOTE: as the int4 kernel's: past this many tokens a step dequantizes (natively) and runs the
# GEMM. Interleaved in one process on Qwen2.5-1.5B's shapes (Zen 4, bf16), kernel time over
# dequantize + GEMM: 0.68-0.82 at 32 tokens, 0.72-0.99 at 64, 0.87-1.29 at 128, 1.12-1.6 at
# 256. Without the int8 codes' unpacking to share, it is slower per token than the int4 kernel.
MAX_TOKENS = 64

_matmul = KernelFunction(
    "int8_linear", "int8_linear", [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 + [ctypes.c_int]
)
_dequantize = KernelFunction(
    "int8_linear", "int8_dequantize", [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [ctypes.c_int]
)
_int8_codes = KernelFunction(
    "int8_linear", "int8_int8_codes", [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 + [ctypes.c_int]
)


def is_supported(
    in_features: int, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu"
) -> bool:
    """Whether the kernel can serve an int8 weight of `in_features` columns for a `dtype` model
    on `device` (bf16 or float32, on a CPU the kernels run on)."""
    return (
        torch.device(device).type == "cpu"
        and in_features % BLOCK == 0
        and _matmul(dtype) is not None
    )


def padded_rows(num_rows: int) -> int:
    return -(-num_rows // TILE_ROWS) * TILE_ROWS


def pack_int8(codes: torch.Tensor) -> torch.Tensor:
    """int8 [padded N, K] in the kernel's layout from row-major codes [N, K] (zero rows added)."""
    num_rows, num_cols = codes.shape
    padded = torch.zeros(padded_rows(num_rows), num_cols, dtype=torch.int8)
    padded[:num_rows] = codes
    # [tiles, 64 rows, K/4 steps, 4] -> [tiles, K/4, 64, 4]
    tiles = padded.view(-1, TILE_ROWS, num_cols // STEP, STEP).transpose(1, 2)
    return tiles.contiguous().view(-1, num_cols)


def unpack_int8_rows(packed: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Row-major codes [end - start, K] of rows [start, end) of a packed weight."""
    num_cols = packed.shape[1]
    first_tile, last_tile = start // TILE_ROWS, -(-end // TILE_ROWS)
    tiles = packed[first_tile * TILE_ROWS : last_tile * TILE_ROWS]
    rows = tiles.view(-1, num_cols // STEP, TILE_ROWS, STEP).transpose(1, 2).reshape(-1, num_cols)
    offset = first_tile * TILE_ROWS
    return rows[start - offset : end - offset]


def unpack_int8_row_ids(packed: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """Row-major codes [len(row_ids), K] of the rows `row_ids` (1-d) of a packed weight."""
    num_cols = packed.shape[1]
    tiles = packed.view(-1, num_cols // STEP, TILE_ROWS, STEP)
    return tiles[row_ids // TILE_ROWS, :, row_ids % TILE_ROWS].reshape(len(row_ids), num_cols)


def int8_matmul(
    codes: torch.Tensor, scales: torch.Tensor, out_features: int, dtype: torch.dtype
) -> WeightMatmul:
    """x [M, K] (contiguous, of `dtype`) times a packed int8 weight -> [M, out_features]."""
    if scales.dtype != dtype or scales.shape != (codes.shape[0],):
        raise ValueError(f"scales {scales.dtype} {list(scales.shape)} for {dtype} codes")
    return WeightMatmul(
        require(_matmul(dtype), "int8_linear"),
        (codes, scales),
        name="int8",
        in_features=codes.shape[1],
        out_features=out_features,
        padded_out_features=codes.shape[0],
        dtype=dtype,
    )


def dequantize_transposed(
    codes: torch.Tensor, scales: torch.Tensor, start: int, end: int, dtype: torch.dtype
) -> torch.Tensor | None:
    """Rows [start, end) of a packed int8 weight (scales of `dtype`) as W^T [K, end - start]
    (`start` a multiple of 64), the same values as dequantizing with PyTorch ops, or None where
    the native kernel cannot run."""
    kernel = _dequantize(dtype)
    if kernel is None or scales.dtype != dtype:
        return None
    return dequantize_packed_transposed(
        kernel,
        (codes, scales),
        name="int8",
        start=start,
        end=end,
        in_features=codes.shape[1],
        dtype=dtype,
    )


def int8_codes_transposed(
    codes: torch.Tensor,
    scales: torch.Tensor,
    start: int,
    end: int,
    dtype: torch.dtype,
    *,
    scratch: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows [start, end) of a packed int8 weight (scales of `dtype`; `start` a multiple of 64)
    recoded per row for the integer GEMM: int8 codes W^T [K, end - start] and float32 scales,
    `Int8GemmWeight.from_rows` of the rows in float32, bit for bit; None where the native
    kernel cannot run. `scratch`: as for int4_linear.int8_codes_transposed."""
    kernel = _int8_codes(dtype)
    if kernel is None or scales.dtype != dtype:
        return None
    return int8_codes_packed_transposed(
        kernel,
        (codes, scales),
        name="int8",
        start=start,
        end=end,
        in_features=codes.shape[1],
        scratch=scratch,
    )
