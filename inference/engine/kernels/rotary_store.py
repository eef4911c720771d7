"""Rotary embedding of q and k plus the KV-cache write, in one native call (bf16, CPU).

In PyTorch, rotating q and k and storing k and v is a dozen small ops a layer (slices, a
concatenation, two products and a sum, the copies that make k and v contiguous, two
index_copy_); at one token per sequence their dispatch costs more than the arithmetic.
`csrc/rotary_store.c` does it in one pass, bitwise as transformers rounds it in bf16
(each product rounded, then the sum). Other dtypes, an int8 KV cache and other devices keep
the PyTorch ops (models/llama.py, layers/attention/paged.py).
"""

from __future__ import annotations

import ctypes

import torch

from inference.engine.kernels import KernelFunction, require

# qkv, cos, sin, k_cache, v_cache, write_index, q_out, k_out; tokens, num_heads, num_kv_heads,
# head_dim; num_threads
_kernel = KernelFunction(
    "rotary_store", "rotary_store", [ctypes.c_void_p] * 8 + [ctypes.c_int64] * 4 + [ctypes.c_int]
)


def is_supported(qkv: torch.Tensor, k_cache: torch.Tensor, head_dim: int) -> bool:
    """Whether `rotate_and_store` can serve this layer's projections and cache (one dtype)."""
    return (
        k_cache.dtype == qkv.dtype
        and qkv.device.type == "cpu"
        and head_dim % 32 == 0
        and _kernel(qkv.dtype) is not None
    )


def rotate_and_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    write_index: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated q [tokens, num_heads, head_dim] and k [tokens, num_kv_heads, head_dim]; the
    rotated keys and the values are written to the caches' rows `write_index` (see
    layers/attention/metadata.py). `sin` has its first half negated (RotaryEmbedding)."""
    num_tokens = qkv.shape[0]
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    q = qkv.new_empty(num_tokens, num_heads, head_dim)
    k = qkv.new_empty(num_tokens, num_kv_heads, head_dim)
    status = require(_kernel(qkv.dtype), "rotary_store")(
        qkv.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        write_index.contiguous().data_ptr(),
        q.data_ptr(),
        k.data_ptr(),
        num_tokens,
        num_heads,
        num_kv_heads,
        head_dim,
        torch.get_num_threads(),
    )
    if status != 0:
        raise ValueError(f"head_dim {head_dim} is not a multiple of 32")
    return q, k
