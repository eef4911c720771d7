"""RMSNorm as Llama-family models round it, and as Gemma does.

Both normalise in float32; they differ in where the weight applies. Llama (and Qwen, Mistral)
rounds the normalised row to the model dtype and multiplies by the weight there; Gemma stores
the weight as an offset from one and multiplies by (1 + weight) in float32 before rounding. In
float32 the two only differ by that offset; in bf16 the rounding differs too, so each has its
own module and only the Llama one runs the native kernel (kernels/rms_norm.py rounds its way).
Both normalise the last axis, so they also serve as per-head q/k norms over head_dim.
"""

from __future__ import annotations

import torch
from torch import nn

from inference.engine.kernels import rms_norm as native_rms_norm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, *, native_kernels: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.native_kernels = native_kernels

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(norm(x), None), or with the residual stream: (norm(x + residual), x + residual).

        Adding the residual here lets bf16 on CPU do both in one native call (see
        kernels/rms_norm.py), which then updates `residual` in place.
        """
        if self.native_kernels and native_rms_norm.is_supported(x, self.weight):
            return native_rms_norm.add_rms_norm(x, residual, self.weight, self.eps), residual
        if residual is not None:
            x = residual = residual + x
        # NOTE: normalised in float32 and rounded before the weight is applied, as transformers
        # does. (F.rms_norm is bitwise the same but no faster on CPU: it is not fused there.)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype), residual


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), all in float32, rounded to x's dtype once at the end."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        # NOTE: zeros, transformers' initial value: the effective scale is 1 + weight.
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float()
        normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)
