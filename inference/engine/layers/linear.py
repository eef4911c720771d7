"""bf16 linear layers with their weights packed once at load time: for the AMX kernel
(`AmxLinear`, kernels/linear_bf16.py) or for oneDNN (`PackedLinear`).

The runner packs a plain bf16 model on CPU in two passes: `pack_model_for_amx` takes the layers
(and a tied embedding table) the AMX kernel supports, then `pack_linear_layers` gives oneDNN the
`nn.Linear` layers left (all of them on CPUs without AMX). float32 (the exactness tests) and
quantized models keep their own layers.

oneDNN: `F.linear` in bf16 on CPU reorders the weight into oneDNN's blocked (VNNI) layout on
every call. For a decode step that reorder costs as much as the matmul itself: the weight is
read, rewritten and read again. Measured on the 2-core Sapphire Rapids box (AMX, torch 2.13), a
prepacked [3072, 576] weight at 1 token 177 -> 103 us, [576, 1536] 106 -> 45 us, the [49152, 576]
logits matrix 2.1 -> 1.3 ms; prefill (1,250 tokens) is faster too, and the results are bitwise
those of `F.linear`. NOTE: oneDNN does not get the tied embedding table: its rows are also the
token lookup, so packing would keep a second 56 MB copy of a fifth of the model's weights. The
AMX layout can give rows back (`AmxEmbedding`), so there one packed copy serves both.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.kernels import linear_bf16

logger = logging.getLogger(__name__)


class AmxLinear(nn.Module):
    """y = x @ W.T + b for bf16 x, with W in the AMX tile layout."""

    packed_weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        if not linear_bf16.is_supported(self.out_features, self.in_features):
            raise ValueError(f"weight {list(weight.shape)} does not fit AMX tiles")
        packed = linear_bf16.pack_weight(weight)
        self.register_buffer("packed_weight", packed, persistent=False)
        bias = None if bias is None else bias.detach().to(torch.bfloat16).contiguous()
        self.register_buffer("bias", bias, persistent=False)
        self._matmul = linear_bf16.AmxMatmul(packed, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            return F.linear(x, self.weight_rows(torch.arange(self.out_features)).to(x.dtype))
        if x.dim() != 2 or not x.is_contiguous():
            rows = x.reshape(-1, self.in_features).contiguous()
            return self.forward(rows).view(*x.shape[:-1], self.out_features)
        return self._matmul(x)

    def weight_rows(self, row_ids: torch.Tensor) -> torch.Tensor:
        """Rows `row_ids` (any shape) of W, as they were before packing: [*shape, in]."""
        return linear_bf16.unpack_rows(self.packed_weight, row_ids)

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
    """Swap the model's bf16 `nn.Linear` layers (and a tied embedding) that the AMX kernel
    supports for AMX ones, in place; returns how many (0 on CPUs without AMX).

    The original weights are released as each layer is replaced.
    """
    num_packed = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and linear_bf16.is_supported(
                    child.out_features, child.in_features, child.weight.dtype, child.weight.device
                ):
                    setattr(parent, name, AmxLinear(child.weight, child.bias))
                    num_packed += 1
        embedding = getattr(model, "embed_tokens", None)
        is_tied = getattr(model, "lm_head", "absent") is None
        if (
            is_tied
            and isinstance(embedding, nn.Embedding)
            and linear_bf16.is_supported(
                embedding.num_embeddings,
                embedding.embedding_dim,
                embedding.weight.dtype,
                embedding.weight.device,
            )
        ):
            table = AmxLinear(embedding.weight, None)
            model.embed_tokens = AmxEmbedding(table)
            # NOTE: a tied model's logits then come from the same packed table (see
            # LlamaForCausalLM.compute_logits).
            model.lm_head = table
            num_packed += 1
    if num_packed:
        logger.info("packed %d bf16 matrices for AMX", num_packed)
    return num_packed


def can_pack(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether oneDNN has bf16 kernels here, for a model of `dtype` on `device`."""
    return (
        torch.device(device).type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


class PackedLinear(nn.Module):
    """An `nn.Linear` whose weight lives in oneDNN's packed layout; y = x @ W.T + b."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        # NOTE: the batch-size hint (1) picks the layout for decode steps; the same packed
        # weight serves every batch size, and was measured faster than F.linear up to prefill.
        self.register_buffer(
            "packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, 1), persistent=False
        )
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, self.in_features).contiguous(),
            self.packed_weight,
            self.bias,
            "none",
            [],
            "",
        )
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 packed"


def pack_linear_layers(model: nn.Module) -> int:
    """Swap every bf16 `nn.Linear` of `model` for a `PackedLinear` (oneDNN), in place; returns
    how many."""
    num_packed = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16:
                    setattr(parent, name, PackedLinear(child))
                    num_packed += 1
    logger.info("packed %d bf16 linear layers for oneDNN", num_packed)
    return num_packed
