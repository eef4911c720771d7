"""Allocating the paged KV cache from a byte budget."""

from __future__ import annotations

import pytest
import torch

from inference.engine.kv_cache import KVCacheSpec, allocate_kv_cache


def _spec(dtype: torch.dtype = torch.bfloat16) -> KVCacheSpec:
    return KVCacheSpec(num_layers=3, num_kv_heads=2, head_dim=8, block_size=4, dtype=dtype)


def test_bytes_per_block_counts_keys_and_values_of_every_layer():
    # 2 (k, v) * 3 layers * 4 tokens * 2 heads * 8 dims * 2 bytes
    assert _spec().bytes_per_block == 768
    assert _spec(torch.float32).bytes_per_block == 1536


def test_number_of_blocks_is_the_budget_divided_by_bytes_per_block():
    cache = allocate_kv_cache(_spec(), budget_bytes=768 * 10 + 767, max_model_len=16)
    assert cache.num_blocks == 10
    assert cache.block_size == 4


def test_budget_below_one_max_length_sequence_raises_with_the_minimum_budget():
    # max_model_len 17 needs ceil(17 / 4) = 5 blocks = 3840 bytes
    with pytest.raises(ValueError, match=r"at least 3840 bytes"):
        allocate_kv_cache(_spec(), budget_bytes=3839, max_model_len=17)
    assert allocate_kv_cache(_spec(), budget_bytes=3840, max_model_len=17).num_blocks == 5


def test_each_layer_gets_zeroed_paged_key_and_value_tensors():
    cache = allocate_kv_cache(_spec(), budget_bytes=768 * 6, max_model_len=8)
    assert len(cache.layers) == 3
    for keys, values in cache.layers:
        assert keys.shape == values.shape == (6, 2, 4, 8)  # blocks, kv heads, tokens, dims
        assert keys.dtype == torch.bfloat16
        assert keys.is_contiguous()
        assert not keys.any() and not values.any()
    first_keys = cache.layers[0][0]
    first_keys.fill_(1)
    assert not cache.layers[0][1].any() and not cache.layers[1][0].any()
