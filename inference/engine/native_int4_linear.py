"""The native int4 matmul (`csrc/int4_linear.c`, AVX-512 VNNI) and its weight layout.

`quantization.Int4Linear` stores its codes in this layout when the kernel can run (a CPU with
`avx512_vnni` and `avx512_bf16`, a bf16 model) and in PyTorch's int4 CPU layout otherwise. Both
layouts take N * K / 2 bytes and share the scales_and_zeros array, so memory is the same.

Layout: tiles of 64 output rows, each [K/8][64][4] bytes; byte b of row r at step j holds
column 8j + b in its low nibble and column 8j + 4 + b in its high nibble.

Numerics: activations are quantized per token to int8 in blocks of 32 (absmax scale), as
llama.cpp does for its Q4 x Q8 dot products; the sums are float32, the output bf16. Measured
on SmolLM2-135M (int4, groups of 32): see tests/test_native_int4_linear.py for the bounds.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from inference.engine.native_kernels import load_function

TILE_ROWS = 64  # csrc: TILE_ROWS
BLOCK = 32  # activation columns per int8 block (csrc: BLOCK)
# NOTE: up to here the kernel beats dequantizing + the bf16 GEMM. It unpacks each 64-row tile
# once per token, so its time grows with the tokens while dequantizing is a fixed cost:
# measured for [3072, 576] at 16 / 128 / 256 tokens, 0.22 / 1.6 / 3.1 ms against 2.2 / 2.6 /
# 2.5 ms.
MAX_TOKENS = 128


@functools.cache
def _matmul():
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    return load_function(
        "int4_linear", "int4_linear_vnni", [pointer] * 4 + [size] * 5 + [ctypes.c_int]
    )


def native_int4_available() -> bool:
    return _matmul() is not None


def fits_native_int4(in_features: int, group_size: int) -> bool:
    return in_features % BLOCK == 0 and group_size % BLOCK == 0


def pack_int4_vnni(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] in the kernel's layout from int4 codes [N, K] (N a multiple of 64)."""
    num_rows, num_cols = codes.shape
    steps = codes.to(torch.uint8).view(num_rows // TILE_ROWS, TILE_ROWS, num_cols // 8, 2, 4)
    packed = steps[:, :, :, 0] | (steps[:, :, :, 1] << 4)  # [tiles, 64, K/8, 4]
    return packed.transpose(1, 2).contiguous().view(num_rows, num_cols // 2)


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


class Int4VnniMatmul:
    """x [M, K] bf16 (contiguous) times a packed int4 weight -> [M, out_features] bf16.

    The kernel and the weight's pointers are resolved once: a decode step makes ~120 of these
    calls, and per-call lookups were a measurable share of their Python cost.
    """

    def __init__(
        self,
        codes: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        group_size: int,
        out_features: int,
    ) -> None:
        self.codes = codes  # keeps the pointers below alive
        self.scales_and_zeros = scales_and_zeros
        self.group_size = group_size
        self.out_features = out_features
        self.in_features = codes.shape[1] * 2
        self._arguments = (
            codes.data_ptr(),
            scales_and_zeros.data_ptr(),
        )
        self._padded_rows = codes.shape[0]
        self._matmul = _matmul()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        num_tokens, in_features = x.shape
        if in_features != self.in_features:
            raise ValueError(
                f"input of {in_features} features for an int4 [{self.out_features}, "
                f"{self.in_features}] weight"
            )
        out = torch.empty(num_tokens, self.out_features, dtype=torch.bfloat16)
        status = self._matmul(
            x.data_ptr(),
            *self._arguments,
            out.data_ptr(),
            num_tokens,
            self.out_features,
            self._padded_rows,
            in_features,
            self.group_size,
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(
                f"int4 kernel refused x {list(x.shape)}, weight {list(self.codes.shape)}, "
                f"groups of {self.group_size} (status {status})"
            )
        return out
