"""Allocating the paged KV cache from a memory budget.

Every layer gets a key and a value tensor [num_blocks, num_kv_heads, block_size, head_dim] (the
head-major layout `attention.py` explains); block `b` of every layer together holds the
keys/values of the same `block_size` token positions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        """Keys and values of one block across all layers."""
        element_size = torch.empty((), dtype=self.dtype).element_size()
        return (
            2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element_size
        )


@dataclass(slots=True)
class KVCache:
    num_blocks: int
    block_size: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # (keys, values) per layer


def allocate_kv_cache(
    spec: KVCacheSpec, *, budget_bytes: int, max_model_len: int, device: torch.device | str = "cpu"
) -> KVCache:
    """As many blocks as fit in `budget_bytes`; at least one `max_model_len` sequence must fit."""
    if spec.block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {spec.block_size}")
    min_blocks = -(-max_model_len // spec.block_size)
    num_blocks = budget_bytes // spec.bytes_per_block
    if num_blocks < min_blocks:
        min_bytes = min_blocks * spec.bytes_per_block
        raise ValueError(
            f"a KV cache budget of {budget_bytes} bytes holds {num_blocks} blocks of "
            f"{spec.block_size} tokens, but one sequence of max_model_len={max_model_len} needs "
            f"{min_blocks}: give the KV cache at least {min_bytes} bytes "
            f"({min_bytes / 2**20:.1f} MiB) or lower max_model_len"
        )
    # NOTE: zero-filled, not torch.empty: padded decode batches read blocks they then mask out,
    # and uninitialised memory may hold NaNs, which survive a masked softmax (0 * NaN = NaN).
    storage = torch.zeros(
        2,
        spec.num_layers,
        num_blocks,
        spec.num_kv_heads,
        spec.block_size,
        spec.head_dim,
        dtype=spec.dtype,
        device=device,
    )
    layers = [(storage[0, i], storage[1, i]) for i in range(spec.num_layers)]
    logger.info(
        "KV cache: %d blocks of %d tokens (%.1f MiB, %d tokens)",
        num_blocks,
        spec.block_size,
        num_blocks * spec.bytes_per_block / 2**20,
        num_blocks * spec.block_size,
    )
    return KVCache(num_blocks=num_blocks, block_size=spec.block_size, layers=layers)
