"""A decoder's self-attention block: projections, per-head q/k norms, RoPE, paged attention.

q, k and v come from one fused projection (one GEMM reads the activations once). Qwen3 and
Gemma 3 normalise each query and key head over head_dim before the rotation (`qk_norm`, the
Llama-style or the Gemma RMSNorm). A sliding-window layer attends only the last
`sliding_window` positions (see metadata.py).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from inference.engine.kernels import rotary_store as native_rotary
from inference.engine.kv_cache import LayerKVCache
from inference.engine.layers.attention.metadata import AttentionMetadata
from inference.engine.layers.attention.paged import paged_attention
from inference.engine.layers.norm import GemmaRMSNorm, RMSNorm
from inference.engine.layers.rotary import apply_rotary

QKNorm = Literal["rms", "gemma"]


class SelfAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        scale: float,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: QKNorm | None = None,
        norm_eps: float = 1e-6,
        sliding_window: int | None = None,
        native_kernels: bool = True,
    ) -> None:
        super().__init__()
        self.native_kernels = native_kernels
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.qkv_proj = nn.Linear(hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = nn.Linear(self.q_size, hidden_size, bias=o_bias)
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if qk_norm == "rms":
            self.q_norm = RMSNorm(head_dim, norm_eps, native_kernels=native_kernels)
            self.k_norm = RMSNorm(head_dim, norm_eps, native_kernels=native_kernels)
        elif qk_norm == "gemma":
            self.q_norm = GemmaRMSNorm(head_dim, norm_eps)
            self.k_norm = GemmaRMSNorm(head_dim, norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: LayerKVCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        if self.q_norm is not None and self.k_norm is not None:
            q = _normalize(self.q_norm, qkv[:, : self.q_size].view(num_tokens, -1, self.head_dim))
            k_end = self.q_size + self.kv_size
            k = _normalize(
                self.k_norm, qkv[:, self.q_size : k_end].view(num_tokens, -1, self.head_dim)
            )
            qkv = torch.cat((q.flatten(1), k.flatten(1), qkv[:, k_end:]), dim=-1)
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        is_stored = (
            self.native_kernels
            and len(kv_cache) == 2
            and native_rotary.is_supported(qkv, kv_cache[0], self.head_dim)
        )
        if is_stored:  # bf16 cache on CPU: rotation and cache write in one native call
            q, k = native_rotary.rotate_and_store(
                qkv,
                cos,
                sin,
                kv_cache[0],
                kv_cache[1],
                metadata.write_index,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
            )
        else:
            # NOTE: q and k sit side by side in each row, so one rotation covers both.
            qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, -1, self.head_dim)
            qk = apply_rotary(qk, cos, sin)
            q = qk[:, : self.num_heads]
            k = qk[:, self.num_heads :]
        out = paged_attention(
            q,
            k,
            v,
            kv_cache[0],
            kv_cache[1],
            metadata,
            scale=self.scale,
            kv_scales=kv_cache[2:],
            is_kv_stored=is_stored,
            sliding_window=self.sliding_window,
        )
        projected: torch.Tensor = self.o_proj(out.view(num_tokens, self.q_size))
        return projected


def _normalize(norm: nn.Module, heads: torch.Tensor) -> torch.Tensor:
    """`norm` over the last axis of [num_tokens, heads, head_dim] (either RMSNorm flavour)."""
    if isinstance(norm, RMSNorm):
        normed: torch.Tensor = norm(heads)[0]
        return normed
    out: torch.Tensor = norm(heads)
    return out
