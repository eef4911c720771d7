"""Decode attention read straight from the paged KV cache by a native kernel (CPU).

The PyTorch path (layers/attention/paged.py) gathers every decode's blocks into a contiguous
copy and then runs SDPA over it: the context is read, written and read again in every layer. The
kernel (`csrc/paged_decode_attention.c`) reads each key/value row once, for all
the query heads that share it. Measured on the 2-core Sapphire Rapids box, one layer, bf16:
1 decode at 1,264 tokens 117 -> 54 us; 28 decodes at 900 tokens 2.2 -> 1.2 ms (with the
context in cache; streamed from memory, as in a model's step, 28 decodes at 920 tokens took
2.2 ms before the kernel prefetched each next tile's keys and values, 1.5 ms after).

Results agree with PyTorch's flash attention to the cache dtype's rounding (bf16 caches: the
probabilities are rounded to bf16 for the value sum, as that kernel does), not bitwise. bf16 and
float32 caches (the float32 models of CPUs without native bf16) are served.
"""

from __future__ import annotations

import ctypes
import math

import torch

from inference.engine.kernels import KernelFunction, require

# Enough work items per thread to even out partitions of unequal length.
ITEMS_PER_THREAD = 8
MIN_BLOCKS_PER_PARTITION = 4
MAX_GROUP = 16  # query heads per KV head (csrc: MAX_GROUP)
MAX_HEAD_DIM = 256

_ARGTYPES = [
    ctypes.c_void_p,  # q
    ctypes.c_void_p,  # k_cache
    ctypes.c_void_p,  # v_cache
    ctypes.c_void_p,  # block_tables
    ctypes.c_int64,  # table_stride
    ctypes.c_void_p,  # context_lens
    ctypes.c_int64,  # num_seqs
    ctypes.c_int64,  # num_kv_heads
    ctypes.c_int64,  # group
    ctypes.c_int64,  # head_dim
    ctypes.c_int64,  # block_size
    ctypes.c_float,  # scale
    ctypes.c_int64,  # tokens_per_part
    ctypes.c_int64,  # num_parts
    ctypes.c_void_p,  # out
    ctypes.c_void_p,  # lse (or NULL)
    ctypes.c_void_p,  # scratch
    ctypes.c_int,  # num_threads
]


_kernel = KernelFunction("paged_decode_attention", "paged_decode_attention", _ARGTYPES)


def is_supported(
    dtype: torch.dtype,
    device: torch.device,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
) -> bool:
    """Whether the kernel can serve attention of this shape (and is built for this machine)."""
    group = num_heads // num_kv_heads
    return (
        device.type == "cpu"
        and 1 <= group <= MAX_GROUP
        and head_dim % 32 == 0
        and head_dim <= MAX_HEAD_DIM
        and block_size % 16 == 0
        and _kernel(dtype) is not None
    )


def context_partitions(
    num_seqs: int, num_kv_heads: int, max_blocks: int, num_threads: int
) -> tuple[int, int]:
    """(blocks per partition, number of partitions) splitting contexts of up to `max_blocks`
    blocks so that every thread gets ~ITEMS_PER_THREAD work items."""
    wanted_parts = math.ceil(ITEMS_PER_THREAD * num_threads / (num_seqs * num_kv_heads))
    max_parts = max(1, max_blocks // MIN_BLOCKS_PER_PARTITION)
    blocks_per_part = math.ceil(max_blocks / max(1, min(wanted_parts, max_parts)))
    return blocks_per_part, math.ceil(max_blocks / blocks_per_part)


def paged_decode_attention(
    grouped_q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    with_lse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of one query token per sequence over its cached context.

    grouped_q [num_seqs, num_kv_heads, group, head_dim] (query heads grouped by the KV head
    they use); caches [num_blocks, num_kv_heads, block_size, head_dim], of q's dtype (bf16 or
    float32); block_table
    [num_seqs, >= blocks needed] int32; context_lens [num_seqs] int32, each >= 1.
    Returns float32 [num_seqs, num_kv_heads, group, head_dim] and, with `with_lse`, the
    log-sum-exp of the scaled scores [num_seqs, num_kv_heads, group] (for cascade merging).
    """
    kernel = require(_kernel(k_cache.dtype), "paged_decode_attention")
    num_seqs, num_kv_heads, group, head_dim = grouped_q.shape
    block_size = k_cache.shape[2]
    if not (grouped_q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the kernel needs contiguous q and caches")
    if grouped_q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q {grouped_q.dtype} and caches {k_cache.dtype} must share a dtype")
    if block_table.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise ValueError("block_table and context_lens must be int32")
    block_table = block_table.contiguous()
    context_lens = context_lens.contiguous()
    num_threads = torch.get_num_threads()
    blocks_per_part, num_parts = context_partitions(
        num_seqs, num_kv_heads, block_table.shape[1], num_threads
    )

    out = torch.empty(grouped_q.shape, dtype=torch.float32)
    lse = torch.empty(grouped_q.shape[:-1], dtype=torch.float32) if with_lse else None
    scratch = torch.empty(num_seqs * num_kv_heads * num_parts * group * (head_dim + 2))
    status = kernel(
        grouped_q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_table.data_ptr(),
        block_table.stride(0),
        context_lens.data_ptr(),
        num_seqs,
        num_kv_heads,
        group,
        head_dim,
        block_size,
        scale,
        blocks_per_part * block_size,
        num_parts,
        out.data_ptr(),
        None if lse is None else lse.data_ptr(),
        scratch.data_ptr(),
        num_threads,
    )
    if status != 0:
        raise ValueError(
            f"shape not supported by the kernel: group {group}, head_dim {head_dim}, "
            f"block_size {block_size}"
        )
    return out, lse
