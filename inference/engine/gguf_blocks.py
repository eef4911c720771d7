"""GGUF's quantized blocks as the engine reads them: 4-bit codes with their scales, or floats.

The 4-bit block types hold, per group of 32 weights, codes q in [0, 15] and a linear map
w = scale * q + offset:
- Q4_0 (18 bytes): a float16 d, 16 bytes of nibbles; scale d, offset -8 d.
- Q4_1 (20 bytes): float16 d and m; scale d, offset m.
- Q4_K (144 bytes for 256 weights): float16 d and dmin for the super-block, 6-bit scales sc and
  mins m for its eight groups of 32 (packed in 12 bytes), 128 bytes of nibbles; scale d sc,
  offset -dmin m.
`int4_blocks` returns exactly those codes, scales and offsets (no round trip through floats), so
`Int4Linear.from_codes` can keep the checkpoint's own codes. Every other type is read as float32
rows, a chunk at a time, through the `gguf` package's own dequantization (Q4_1 and Q4_K through
the codes, which gives gguf's values bit for bit, 3x faster).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from inference.engine.gguf_file import FLOAT_TYPES

INT4_GROUP = 32  # weights per scale in every 4-bit block type
FOUR_BIT_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K)
# NOTE: kept in int8 per row: 5 to 8 bits per weight do not fit int4's 16 levels.
EIGHT_BIT_TYPES = (
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.Q8_0,
)
SUPPORTED_TYPES = FOUR_BIT_TYPES + EIGHT_BIT_TYPES + FLOAT_TYPES
_Q4_K_BLOCK_BYTES = 144
# the 4-bit types whose w = scale * q + offset rounds exactly as gguf.quants.dequantize does
_EXACT_FROM_CODES = (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K)


@dataclass(frozen=True, slots=True)
class Int4Blocks:
    """w = scales * codes + offsets, per group of `INT4_GROUP` columns."""

    codes: torch.Tensor  # uint8 [rows, columns]
    scales: torch.Tensor  # float32 [rows, columns / 32]
    offsets: torch.Tensor  # float32 [rows, columns / 32]

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, columns]."""
        rows, columns = self.codes.shape
        grouped = self.codes.view(rows, -1, INT4_GROUP).float() * self.scales[..., None]
        return (grouped + self.offsets[..., None]).view(rows, columns)


def int4_blocks(raw: np.ndarray, ggml_type: GGMLQuantizationType) -> Int4Blocks:
    """The codes, scales and offsets of raw rows (uint8 [rows, bytes per row]) of a 4-bit type."""
    num_rows = raw.shape[0]
    data = torch.from_numpy(np.array(raw))  # a writable copy of the mapped bytes
    if ggml_type == GGMLQuantizationType.Q4_K:
        codes, scales, offsets = _q4_k(data.view(-1, _Q4_K_BLOCK_BYTES))
    elif ggml_type == GGMLQuantizationType.Q4_1:
        blocks = data.view(-1, 20)
        codes, scales, offsets = _nibbles(blocks[:, 4:]), _half(blocks, 0), _half(blocks, 2)
    elif ggml_type == GGMLQuantizationType.Q4_0:
        blocks = data.view(-1, 18)
        scales = _half(blocks, 0)
        codes, offsets = _nibbles(blocks[:, 2:]), -8 * scales
    else:
        raise ValueError(f"{ggml_type.name} is not a 4-bit block type")
    return Int4Blocks(
        codes.reshape(num_rows, -1),
        scales.reshape(num_rows, -1).contiguous(),
        offsets.reshape(num_rows, -1).contiguous(),
    )


def float_rows(raw: np.ndarray, ggml_type: GGMLQuantizationType) -> torch.Tensor:
    """float32 [rows, columns] of raw rows (uint8 [rows, bytes per row]) of any supported type."""
    if ggml_type == GGMLQuantizationType.F32:
        return torch.from_numpy(np.ascontiguousarray(raw).view(np.float32).copy())
    if ggml_type in _EXACT_FROM_CODES:
        # NOTE: the same float32 values as gguf's (the same two roundings), several times faster.
        return int4_blocks(raw, ggml_type).dequantize()
    if ggml_type == GGMLQuantizationType.BF16:
        # NOTE: numpy has no bfloat16; the bits go through torch's.
        bits = torch.from_numpy(np.ascontiguousarray(raw).view(np.int16).copy())
        return bits.view(torch.bfloat16).float()
    return torch.from_numpy(np.asarray(quants.dequantize(raw, ggml_type), dtype=np.float32))


def _half(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte `start` of each block, as float32 [blocks]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16)[:, 0].float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[blocks, 16] bytes -> [blocks, 32] codes: low nibbles are weights 0-15, high 16-31."""
    return torch.cat((packed & 15, packed >> 4), dim=-1)


def _q4_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[blocks, 144] bytes -> codes [blocks, 256], scales and offsets [blocks, 8]."""
    d, dmin = _half(blocks, 0), _half(blocks, 2)
    packed = blocks[:, 4:16]
    # The eight 6-bit scales and mins: groups 0-3 in the low 6 bits of bytes 0-3 (scales) and
    # 4-7 (mins); groups 4-7 in the nibbles of bytes 8-11 plus the top 2 bits of bytes 0-7.
    low, high, nibbles = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat((low & 63, (nibbles & 15) | ((low >> 2) & 48)), dim=-1)
    mins = torch.cat((high & 63, (nibbles >> 4) | ((high >> 2) & 48)), dim=-1)
    # 128 bytes in four runs of 32: run r holds group 2r in its low nibbles, 2r + 1 in its high.
    runs = blocks[:, 16:].reshape(-1, 4, 1, 32)
    codes = torch.cat((runs & 15, runs >> 4), dim=2).reshape(-1, 256)
    return codes, d[:, None] * sc.float(), -(dmin[:, None] * mins.float())
