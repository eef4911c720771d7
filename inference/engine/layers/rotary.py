"""Rotary position embedding (RoPE): its settings, inverse frequencies and the rotation.

The tables are float32 and cast to the model dtype, and the rotation is transformers'
x * cos + rotate_half(x) * sin op for op, so results are bitwise theirs. Architectures with
several RoPE bases (Gemma 3: one for sliding-window layers, one for global ones) keep one
`RotaryEmbedding` per base.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(slots=True)
class RopeArgs:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf_config(cls, config: Any) -> RopeArgs:
        """Read RoPE settings from transformers 5 `rope_parameters` or the older
        `rope_scaling` + `rope_theta` attributes."""
        params = getattr(config, "rope_parameters", None) or {}
        legacy = getattr(config, "rope_scaling", None) or {}
        default_theta = getattr(config, "rope_theta", None) or 10000.0
        return cls.from_parameters({**legacy, **params}, default_theta, config)

    @classmethod
    def from_parameters(
        cls, params: Mapping[str, Any], default_theta: float, config: Any
    ) -> RopeArgs:
        """RoPE settings from one `rope_parameters` dict (`config` for what it leaves out)."""
        rope_type = params.get("rope_type") or params.get("type") or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"RoPE type {rope_type!r} is not supported; supported: {list(SUPPORTED_ROPE_TYPES)}"
            )
        theta = params.get("rope_theta") or default_theta
        args = cls(theta=float(theta), rope_type=rope_type)
        if rope_type in ("linear", "llama3"):
            if "factor" not in params:
                raise ValueError(f"RoPE type {rope_type!r} needs a 'factor' in the config")
            args.factor = float(params["factor"])
        if rope_type == "llama3":
            args.low_freq_factor = float(params["low_freq_factor"])
            args.high_freq_factor = float(params["high_freq_factor"])
            args.original_max_position_embeddings = int(
                params.get("original_max_position_embeddings", config.max_position_embeddings)
            )
        return args


def rope_inv_freq(rope: RopeArgs, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32, as transformers computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        # NOTE: Llama 3.1 keeps high frequencies, divides low ones by `factor` and interpolates
        # smoothly in between (transformers `_compute_llama3_parameters`).
        old_len = rope.original_max_position_embeddings
        low_freq_wavelen = old_len / rope.low_freq_factor
        high_freq_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    inv_freq: torch.Tensor

    def __init__(self, rope: RopeArgs, head_dim: int) -> None:
        super().__init__()
        # NOTE: explicit CPU device: the loader builds the model under a meta-device context and
        # this buffer is not a checkpoint weight, so it must hold real values from the start.
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [num_tokens, head_dim] for `apply_rotary`, once per step."""
        freqs = positions[:, None].float() * self.inv_freq
        cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [num_tokens, num_heads, head_dim] by the half-split (GPT-NeoX) convention.

    `cos` is [num_tokens, head_dim] and `sin` is [num_tokens, head_dim] with its first half
    negated (see `RotaryEmbedding`), so the rotation is x * cos + swap_halves(x) * sin: four ops,
    and bitwise what transformers computes as x * cos + rotate_half(x) * sin.
    """
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + swapped * sin[:, None, :]
