"""The gated feed-forward block: down(act(gate(x)) * up(x)), with gate and up fused.

Llama-family models gate with SiLU (SwiGLU), Gemma with the tanh approximation of GELU (GeGLU).
One GEMM for gate and up reads the activations once; the native kernel covers SiLU only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.kernels import silu_and_mul as native_silu_and_mul

# transformers' `hidden_act` names of the activations a gated MLP may use.
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


class GatedMLP(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        bias: bool = False,
        activation: str = "silu",
        native_kernels: bool = True,
    ) -> None:
        super().__init__()
        if activation not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"activation {activation!r} is not supported; supported: "
                f"{list(SUPPORTED_ACTIVATIONS)}"
            )
        self.activation = activation
        self.native_kernels = native_kernels
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up: torch.Tensor = self.gate_up_proj(x)
        is_native_silu = self.activation == "silu" and self.native_kernels
        if is_native_silu and native_silu_and_mul.is_supported(gate_up):
            activated = native_silu_and_mul.silu_and_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)  # (gate | up), intermediate_size each
            if self.activation == "silu":
                activated = F.silu(gate) * up
            else:
                activated = F.gelu(gate, approximate="tanh") * up
        out: torch.Tensor = self.down_proj(activated)
        return out
