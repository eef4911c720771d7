"""bf16 linear layers (and a tied embedding table) run by a native Intel AMX kernel (CPU).

On CPUs with AMX (`amx_tile`, `amx_bf16`), each bf16 `nn.Linear` of a model is replaced by an
`AmxLinear`: its weight is packed once into AMX's tile layout and multiplied by
`csrc/linear_bf16.c`. Decode is the case that matters: one token times every weight matrix,
where the time is the time to stream the weights. Measured on the 2-core Sapphire Rapids box
(SmolLM2-135M's 120 decoder matrices, 212 MB): 1 token 24.5 -> 11.8 ms (oneDNN's packed bf16
kernel reads ~12 GB/s there; two cores can read ~27), 28 tokens 18.0 -> 10.9 ms, a 512-token
prefill chunk 86 -> 83 ms. Results are float32 sums rounded to bf16, like oneDNN's; on the
test shapes they equal F.linear's bit for bit except for rare last-bit differences.

A tied embedding table is packed the same way: it serves the logits (an `AmxLinear`) and the
token lookup (`AmxEmbedding` reads rows back out of the tile layout), one copy for both.
Shapes the kernel does not take (out_features % 16, in_features % 32) stay `nn.Linear`.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.kernels import load_function

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
    return _Kernel(
        pack=load_function("linear_bf16", "pack_bf16_vnni", [pointer, pointer, size, size], None),
        matmul=load_function(
            "linear_bf16", "linear_bf16_amx", [pointer] * 4 + [size] * 3 + [ctypes.c_int]
        ),
    )


def can_use_amx(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether `pack_model_for_amx` applies to a model of `dtype` on `device`."""
    return dtype == torch.bfloat16 and torch.device(device).type == "cpu" and _kernel() is not None


def fits_amx(out_features: int, in_features: int) -> bool:
    return out_features % TILE_ROWS == 0 and in_features % TILE_K == 0


class AmxLinear(nn.Module):
    """y = x @ W.T + b for bf16 x, with W in the AMX tile layout."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        if not fits_amx(self.out_features, self.in_features):
            raise ValueError(f"weight {list(weight.shape)} does not fit AMX tiles")
        weight = weight.detach().to(torch.bfloat16).contiguous()
        packed = torch.empty_like(weight)
        _kernel().pack(weight.data_ptr(), packed.data_ptr(), self.out_features, self.in_features)
        # [out/16, in/2, 16, 2]: tile t holds output rows 16t..16t+15, pairs of input columns
        self.register_buffer("packed_weight", packed, persistent=False)
        bias = None if bias is None else bias.detach().to(torch.bfloat16).contiguous()
        self.register_buffer("bias", bias, persistent=False)
        # NOTE: the kernel and the weight pointers resolved once: a decode step makes ~120 of
        # these calls, and module buffer lookups plus data_ptr() were a third of their Python
        # cost. The buffers are never replaced (a packed model stays on its CPU).
        self._matmul = _kernel().matmul
        self._weight_ptr = packed.data_ptr()
        self._bias_ptr = None if bias is None else bias.data_ptr()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            return F.linear(x, self.weight_rows(torch.arange(self.out_features)).to(x.dtype))
        if x.dim() != 2 or not x.is_contiguous():
            rows = x.reshape(-1, self.in_features).contiguous()
            return self.forward(rows).view(*x.shape[:-1], self.out_features)
        num_rows, width = x.shape
        if width != self.in_features:
            raise ValueError(f"input of {width} features for {self}")
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
            raise RuntimeError(f"AMX linear refused [{num_rows}, {self.in_features}]: {self}")
        return out

    def weight_rows(self, row_ids: torch.Tensor) -> torch.Tensor:
        """Rows `row_ids` (any shape) of W, as they were before packing: [*shape, in]."""
        tiles = self.packed_weight.view(-1, self.in_features // 2, TILE_ROWS, 2)
        rows = tiles[row_ids // TILE_ROWS, :, row_ids % TILE_ROWS, :]
        return rows.reshape(*row_ids.shape, self.in_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 AMX"


class AmxEmbedding(nn.Module):
    """Token lookup from a tied embedding table packed for `AmxLinear` (the logits)."""

    def __init__(self, table: AmxLinear) -> None:
        super().__init__()
        self.table = table
        self.embedding_dim = table.in_features

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.table.weight_rows(token_ids)


def pack_model_for_amx(model: nn.Module) -> int:
    """Swap the model's bf16 `nn.Linear` layers (and a tied embedding) for AMX ones, in place.

    Returns how many matrices were packed. The original weights are released as each layer
    is replaced.
    """
    num_packed = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if (
                    type(child) is nn.Linear
                    and child.weight.dtype == torch.bfloat16
                    and fits_amx(child.out_features, child.in_features)
                ):
                    setattr(parent, name, AmxLinear(child.weight, child.bias))
                    num_packed += 1
        embedding = getattr(model, "embed_tokens", None)
        is_tied = getattr(model, "lm_head", "absent") is None
        if is_tied and isinstance(embedding, nn.Embedding) and fits_amx(*embedding.weight.shape):
            table = AmxLinear(embedding.weight, None)
            model.embed_tokens = AmxEmbedding(table)
            # NOTE: a tied model's logits then come from the same packed table (see
            # LlamaForCausalLM.compute_logits).
            model.lm_head = table
            num_packed += 1
    logger.info("packed %d bf16 matrices for AMX", num_packed)
    return num_packed
