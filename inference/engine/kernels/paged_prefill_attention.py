"""Prefill attention read straight from the paged KV cache by a native kernel (CPU).

The PyTorch path (layers/attention/paged.py) gathers a prefill chunk's context into a
contiguous copy and runs `F.scaled_dot_product_attention` over it with an offset-causal mask.
PyTorch's CPU flash attention multiplies its tiles at ~110-140 GFLOP/s on a 2-vCPU Zen 4 (AVX-512
BF16, no AMX), a quarter to a third of that machine's bf16 GEMM rate, and attention is most of
a warm prompt's step there (SmolLM2, 256 new tokens over 1,008 cached: 260 of ~450 ms). The
kernel (`csrc/paged_prefill_attention.c`) multiplies with register-blocked vdpbf16ps loops,
reading the keys and values where the cache holds them.

Where it runs: bf16 caches on CPUs with AVX-512 BF16 but no AMX (with AMX, PyTorch's flash
attention multiplies on AMX tiles, ~450 GFLOP/s measured on a 2-vCPU Sapphire Rapids, beyond
what vdpbf16ps reaches, so the engine keeps it there), and float32 caches on every CPU the
kernels build for (AVX-512, AVX2, NEON): the CPUs without native bf16 run models in float32,
and there PyTorch's path also gathers each chunk's context into a copy in every layer.

Results agree with PyTorch's flash attention to the cache type's rounding (bf16: the
probabilities are rounded to bf16 for the value sum, as that kernel does), not bitwise.
"""

from __future__ import annotations

import ctypes

import torch

from inference.engine.kernels import KernelFunction, has_amx, isa_level, require

# Rows (query tokens x the query heads of a KV head) per work item: enough to amortise
# transposing each group of keys, few enough that a chunk gives both cores several items.
ROWS_PER_ITEM = 128
MAX_HEAD_DIM = 256

_ARGTYPES = [
    ctypes.c_void_p,  # q
    ctypes.c_int64,  # q_stride (elements between tokens)
    ctypes.c_void_p,  # k_cache
    ctypes.c_void_p,  # v_cache
    ctypes.c_void_p,  # block_table
    ctypes.c_void_p,  # positions
    ctypes.c_int64,  # num_tokens
    ctypes.c_int64,  # num_kv_heads
    ctypes.c_int64,  # group
    ctypes.c_int64,  # head_dim
    ctypes.c_int64,  # block_size
    ctypes.c_float,  # scale
    ctypes.c_int64,  # tokens_per_item
    ctypes.c_void_p,  # out
    ctypes.c_int64,  # out_stride
    ctypes.c_int,  # num_threads
]

_SHARED_PREFIX_ARGTYPES = [
    ctypes.c_void_p,  # q
    ctypes.c_int64,  # q_stride
    ctypes.c_void_p,  # k_cache
    ctypes.c_void_p,  # v_cache
    ctypes.c_void_p,  # shared_block_table
    ctypes.c_int64,  # num_shared_tokens
    ctypes.c_int64,  # num_seqs
    ctypes.c_int64,  # num_kv_heads
    ctypes.c_int64,  # group
    ctypes.c_int64,  # head_dim
    ctypes.c_int64,  # block_size
    ctypes.c_float,  # scale
    ctypes.c_void_p,  # out (float32)
    ctypes.c_void_p,  # lse (float32)
    ctypes.c_int,  # num_threads
]

_kernel = KernelFunction("paged_prefill_attention", "paged_prefill_attention", _ARGTYPES)
_shared_prefix_kernel = KernelFunction(
    "paged_prefill_attention", "paged_shared_prefix_attention", _SHARED_PREFIX_ARGTYPES
)
_is_built = KernelFunction("paged_prefill_attention", "paged_prefill_attention_is_built", [])


def is_supported(
    dtype: torch.dtype, device: torch.device, num_heads: int, num_kv_heads: int, head_dim: int
) -> bool:
    """Whether the kernel can serve prefill attention of this shape here (bf16: a library built
    with AVX-512 BF16; float32: any level's). Whether it is the faster path is `is_preferred`'s
    question."""
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return False
    if num_heads % num_kv_heads or head_dim % 32 or head_dim > MAX_HEAD_DIM:
        return False
    is_built = _is_built(dtype)
    return is_built is not None and _kernel(dtype) is not None and is_built() == 1


def is_preferred(dtype: torch.dtype) -> bool:
    """Whether a supported kernel beats PyTorch's flash attention here for `dtype`: bf16 not
    with AMX, whose tiles PyTorch's kernel multiplies on (see the module's docstring); float32
    on the AVX-512 levels, where it was measured faster (1.1-2.5x a layer on a Zen 4, README
    "Prefill attention"). Its AVX2 and NEON builds are tested but not measured on such CPUs
    (the AVX2 build on an AVX-512 CPU, against a PyTorch that still used AVX-512, won first
    chunks and lost new turns), so PyTorch's path stays there unless asked for."""
    if dtype == torch.float32:
        level = isa_level()
        return level is not None and "avx512f" in level.required_cpu_flags
    return not has_amx()


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Attention of one sequence's query tokens over its cached context, into `out`.

    q and out [num_tokens, num_heads, head_dim] (bf16 or float32), each token's heads
    contiguous; caches [num_blocks, num_kv_heads, block_size, head_dim] of the same dtype,
    holding every position up to the last query's (the chunk's own keys/values included);
    block_table int32, the sequence's blocks; positions [num_tokens] int32, ascending: query t
    attends positions up to positions[t]. Query head h uses KV head
    h // (num_heads // num_kv_heads).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    for name, tensor in (("q", q), ("out", out)):
        if tensor.stride(2) != 1 or tensor.stride(1) != head_dim:
            raise ValueError(f"{name}'s heads must be contiguous within each token")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the kernel needs contiguous caches")
    if {q.dtype, out.dtype, v_cache.dtype} != {k_cache.dtype}:
        raise ValueError("q, out and the caches must share a dtype")
    if block_table.dtype != torch.int32 or positions.dtype != torch.int32:
        raise ValueError("block_table and positions must be int32")
    if len(positions) != num_tokens:
        raise ValueError(f"{len(positions)} positions for {num_tokens} query tokens")
    if num_tokens and block_table.numel() * block_size <= int(positions[-1]):
        raise ValueError("the block table does not cover the last query's position")
    kernel = require(_kernel(k_cache.dtype), "paged_prefill_attention")
    group = num_heads // num_kv_heads
    block_table = block_table.contiguous()
    positions = positions.contiguous()
    status = kernel(
        q.data_ptr(),
        q.stride(0),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_table.data_ptr(),
        positions.data_ptr(),
        num_tokens,
        num_kv_heads,
        group,
        head_dim,
        block_size,
        scale,
        max(1, ROWS_PER_ITEM // group),
        out.data_ptr(),
        out.stride(0),
        torch.get_num_threads(),
    )
    if status == -2:
        raise MemoryError("paged_prefill_attention: no memory for the work buffers")
    if status != 0:
        raise ValueError(
            f"shape not supported by the kernel: group {group}, head_dim {head_dim}, "
            f"block_size {block_size}"
        )


def paged_shared_prefix_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    shared_block_table: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every decode's query heads over the whole shared prefix `shared_block_table` (full
    blocks), once for all decodes (cascade attention): float32 out [num_seqs, num_heads,
    head_dim] and the log-sum-exp of the scaled scores [num_seqs, num_heads], to merge with
    each decode's own part. q [num_seqs, num_heads, head_dim] (the caches' dtype), each token's
    heads contiguous."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        raise ValueError("q's heads must be contiguous within each token")
    if shared_block_table.dtype != torch.int32:
        raise ValueError("shared_block_table must be int32")
    kernel = require(_shared_prefix_kernel(k_cache.dtype), "paged_shared_prefix_attention")
    table = shared_block_table.contiguous()
    out = torch.empty(num_seqs, num_heads, head_dim, dtype=torch.float32)
    lse = torch.empty(num_seqs, num_heads, dtype=torch.float32)
    status = kernel(
        q.data_ptr(),
        q.stride(0),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        table.data_ptr(),
        table.numel() * block_size,
        num_seqs,
        num_kv_heads,
        num_heads // num_kv_heads,
        head_dim,
        block_size,
        scale,
        out.data_ptr(),
        lse.data_ptr(),
        torch.get_num_threads(),
    )
    if status == -2:
        raise MemoryError("paged_shared_prefix_attention: no memory for the work buffers")
    if status != 0:
        raise ValueError(f"shape not supported by the kernel: head_dim {head_dim}")
    return out, lse
