"""An int4 layer whose quantization groups are not runs of adjacent input columns.

GPTQ's act-order (`desc_act`, compressed-tensors' "group" actorder) quantizes the columns in the
order of their activations' size and gives each column the group of its place in that order
(`g_idx`). The int4 layers and kernels need a group to be `group_size` adjacent columns, so the
layer's columns are stored sorted by group and its input is permuted the same way:
y = x[..., order] @ W[:, order].T, exactly. The price is a gather of the activations per call,
and no fused decode kernel (kernels/decode_layers.py takes plain `Int4Linear` layers only).
"""

from __future__ import annotations

import torch
from torch import nn

from inference.engine.layers.quantization import Int4Linear


class ActOrderLinear(nn.Module):
    """`layer` holds the weight's columns in `input_order` (a permutation of the input features):
    column j of `layer` is column input_order[j] of the checkpoint's weight."""

    input_order: torch.Tensor

    def __init__(self, layer: Int4Linear, input_order: torch.Tensor) -> None:
        super().__init__()
        self.layer = layer
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.register_buffer("input_order", input_order.to(torch.int32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.layer(x.index_select(-1, self.input_order))
        return y

    def dequantize_rows(self, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows [start, end) of the weight in `dtype`, its columns in the checkpoint's order."""
        permuted = self.layer.dequantize_rows(start, end, dtype)
        rows = torch.empty_like(permuted)
        rows[:, self.input_order.long()] = permuted
        return rows

    def extra_repr(self) -> str:
        return "input columns permuted (act-order groups)"
