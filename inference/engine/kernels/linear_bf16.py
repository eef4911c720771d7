"""The bf16 matmul of Intel AMX (`csrc/linear_bf16.c`): y = x @ W.T + b, W packed into tiles.

On CPUs with AMX (`amx_tile`, `amx_bf16`), a weight is packed once into AMX's tile layout
(`pack_weight`) and multiplied by the kernel (`AmxMatmul`); layers/linear.py swaps a model's bf16
`nn.Linear` layers for such layers. Decode is the case that matters: one token times every weight
matrix, where the time is the time to stream the weights. Measured on the 2-core Sapphire Rapids
box (SmolLM2-135M's 120 decoder matrices, 212 MB): 1 token 24.5 -> 11.8 ms (oneDNN's packed bf16
kernel reads ~12 GB/s there; two cores can read ~27), 28 tokens 18.0 -> 10.9 ms, a 512-token
prefill chunk 86 -> 83 ms. Results are float32 sums rounded to bf16, like oneDNN's; on the
test shapes they equal F.linear's bit for bit except for rare last-bit differences.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from inference.engine.kernels import load_function, require

logger = logging.getLogger(__name__)

TILE_ROWS = 16  # output features per tile (csrc: TILE_ROWS)
TILE_K = 32  # input features per tile step (csrc: TILE_K)


@dataclass(frozen=True, slots=True)
class _Kernel:
    pack: Callable[..., None]  # pack_bf16_vnni(weight, packed, n, k)
    matmul: Callable[..., int]  # linear_bf16_amx(x, packed, bias, out, m, n, k, num_threads)


@functools.cache
def _kernel() -> _Kernel | None:
    request_permission = load_function("linear_bf16", "amx_request_permission", [])
    if request_permission is None:
        return None
    if request_permission() != 0:
        logger.warning("the kernel did not get AMX state from Linux; using oneDNN instead")
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    pack = load_function("linear_bf16", "pack_bf16_vnni", [pointer, pointer, size, size], None)
    matmul = load_function(
        "linear_bf16", "linear_bf16_amx", [pointer] * 4 + [size] * 3 + [ctypes.c_int]
    )
    if pack is None or matmul is None:
        return None
    return _Kernel(pack=pack, matmul=matmul)


def is_supported(
    out_features: int,
    in_features: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> bool:
    """Whether the kernel can multiply by a [out_features, in_features] weight of `dtype` on
    `device` (bf16 on a CPU with AMX, whole tiles: out_features % 16, in_features % 32)."""
    return (
        dtype == torch.bfloat16
        and torch.device(device).type == "cpu"
        and out_features % TILE_ROWS == 0
        and in_features % TILE_K == 0
        and _kernel() is not None
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """W [out, in] in the tile layout [out/16, in/2, 16, 2] bf16 (viewed as [out, in]): tile t
    holds output rows 16t..16t+15, pairs of input columns. The caller checked `is_supported`."""
    kernel = require(_kernel(), "linear_bf16")
    out_features, in_features = weight.shape
    weight = weight.detach().to(torch.bfloat16).contiguous()
    packed = torch.empty_like(weight)
    kernel.pack(weight.data_ptr(), packed.data_ptr(), out_features, in_features)
    return packed


def unpack_rows(packed: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """Rows `row_ids` (any shape) of W, as they were before `pack_weight`: [*shape, in]."""
    in_features = packed.shape[1]
    tiles = packed.view(-1, in_features // 2, TILE_ROWS, 2)
    rows = tiles[row_ids // TILE_ROWS, :, row_ids % TILE_ROWS, :]
    return rows.reshape(*row_ids.shape, in_features)


class AmxMatmul:
    """x [M, in] bf16 (contiguous) @ W.T + b -> [M, out] bf16, for a weight from `pack_weight`.

    NOTE: the kernel and the weight pointers are resolved once: a decode step makes ~120 of these
    calls, and module buffer lookups plus data_ptr() were a third of their Python cost. The
    caller keeps `packed` and `bias` alive (and never replaces them).
    """

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = packed.shape
        self._matmul = require(_kernel(), "linear_bf16").matmul
        self._weight_ptr = packed.data_ptr()
        self._bias_ptr = None if bias is None else bias.data_ptr()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        num_rows, width = x.shape
        if width != self.in_features:
            raise ValueError(
                f"input of {width} features for a [{self.out_features}, {self.in_features}] weight"
            )
        out = torch.empty(num_rows, self.out_features, dtype=torch.bfloat16)
        status = self._matmul(
            x.data_ptr(),
            self._weight_ptr,
            self._bias_ptr,
            out.data_ptr(),
            num_rows,
            self.out_features,
            self.in_features,
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(
                f"AMX linear refused [{num_rows}, {self.in_features}] for a "
                f"[{self.out_features}, {self.in_features}] weight"
            )
        return out
