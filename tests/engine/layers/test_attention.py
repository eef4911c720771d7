"""Paged attention against dense attention over unpaged tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.engine.kv_cache import quantize_kv
from inference.engine.layers.attention import build_attention_metadata, paged_attention
from inference.engine.layers.attention import metadata as attention_metadata

BLOCK_SIZE = 4
NUM_BLOCKS = 32
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 8
SCALE = HEAD_DIM**-0.5

# (num_computed_tokens, num_query_tokens, block_table): three decodes of different context
# lengths (one a 1-token prompt), a fresh prompt, and a chunk after a cached prefix whose block
# table is longer than it needs. Tables are deliberately non-contiguous.
SEQUENCES = [
    (9, 1, [7, 2, 30]),
    (2, 1, [5]),
    (0, 1, [11]),
    (0, 6, [3, 19]),
    (5, 7, [25, 1, 14, 8]),
]


def _slot(block_table: list[int], position: int) -> int:
    return block_table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE


def _token(cache: torch.Tensor, slot: int) -> torch.Tensor:
    """The [kv_heads, head_dim] entry of one slot of a [blocks, kv_heads, block_size, dim] cache."""
    return cache[slot // BLOCK_SIZE, :, slot % BLOCK_SIZE]


def _metadata_of(sequences, windows=()):
    """Metadata of (num_computed_tokens, num_query_tokens, block_table) sequences."""
    return build_attention_metadata(
        [n for _, n, _ in sequences],
        [c for c, _, _ in sequences],
        [t for _, _, t in sequences],
        block_size=BLOCK_SIZE,
        num_kv_heads=NUM_KV_HEADS,
        sliding_windows=windows,
    )


def _run_batch(sequences, dtype=torch.float32, num_shared_tokens=0, window=None):
    """Fill each cached prefix, run paged attention; return its output and the dense one.

    The first `num_shared_tokens` keys/values are the same for every sequence (their block
    tables share those blocks). With a `window`, attention is a sliding-window layer's: each
    query sees only the last `window` positions, itself included.
    """
    torch.manual_seed(0)
    k_cache = torch.zeros(NUM_BLOCKS, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    full_keys, full_values, queries = [], [], []
    shared_keys = torch.randn(num_shared_tokens, NUM_KV_HEADS, HEAD_DIM, dtype=dtype)
    shared_values = torch.randn_like(shared_keys)
    for computed, num_query, table in sequences:
        keys = torch.randn(computed + num_query, NUM_KV_HEADS, HEAD_DIM, dtype=dtype)
        values = torch.randn_like(keys)
        keys[:num_shared_tokens], values[:num_shared_tokens] = shared_keys, shared_values
        for position in range(computed):
            _token(k_cache, _slot(table, position))[:] = keys[position]
            _token(v_cache, _slot(table, position))[:] = values[position]
        full_keys.append(keys)
        full_values.append(values)
        queries.append(torch.randn(num_query, NUM_HEADS, HEAD_DIM, dtype=dtype))

    metadata = _metadata_of(sequences, () if window is None else (window,))
    new_keys = torch.cat([k[c:] for k, (c, _, _) in zip(full_keys, sequences, strict=True)])
    new_values = torch.cat([v[c:] for v, (c, _, _) in zip(full_values, sequences, strict=True)])
    out = paged_attention(
        torch.cat(queries),
        new_keys,
        new_values,
        k_cache,
        v_cache,
        metadata,
        scale=SCALE,
        sliding_window=window,
    )

    expected = []
    for q, keys, values, (computed, num_query, _) in zip(
        queries, full_keys, full_values, sequences, strict=True
    ):
        group = NUM_HEADS // NUM_KV_HEADS
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        context = torch.arange(computed + num_query)[None, :]
        query_positions = (computed + torch.arange(num_query))[:, None]
        mask = context <= query_positions
        if window is not None:
            mask &= context > query_positions - window
        dense = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys, values, attn_mask=mask, scale=SCALE
        )
        expected.append(dense.transpose(0, 1))
    return out, torch.cat(expected), metadata, (k_cache, v_cache), (new_keys, new_values)


def test_mixed_prefill_and_decode_batch_matches_dense_attention():
    out, expected, *_ = _run_batch(SEQUENCES)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_decodes_of_one_context_length_match_dense_attention_without_a_mask():
    sequences = [(6, 1, [9, 4]), (6, 1, [0, 31])]
    out, expected, metadata, *_ = _run_batch(sequences)
    assert metadata.decode_mask is None
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_batch_stays_close_to_dense_attention():
    out, expected, *_ = _run_batch(SEQUENCES, dtype=torch.bfloat16)
    torch.testing.assert_close(out.float(), expected.float(), atol=3e-2, rtol=3e-2)


def test_new_keys_and_values_are_written_at_their_slots():
    _, _, metadata, (k_cache, v_cache), (new_keys, new_values) = _run_batch(SEQUENCES)
    expected_slots = [
        _slot(table, position)
        for computed, num_query, table in SEQUENCES
        for position in range(computed, computed + num_query)
    ]
    assert metadata.slot_mapping.tolist() == expected_slots
    written_k = torch.stack([_token(k_cache, slot) for slot in expected_slots])
    written_v = torch.stack([_token(v_cache, slot) for slot in expected_slots])
    torch.testing.assert_close(written_k, new_keys)
    torch.testing.assert_close(written_v, new_values)


def test_positions_continue_after_the_cached_tokens():
    metadata = build_attention_metadata(
        [1, 3], [7, 4], [[0, 1], [2, 3]], block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS
    )
    assert metadata.positions.tolist() == [7, 4, 5, 6]
    assert metadata.num_decode_tokens == 1


def test_single_token_sequences_after_a_prefill_are_rejected():
    with pytest.raises(ValueError, match="single-token sequences must come before"):
        build_attention_metadata(
            [3, 1], [0, 5], [[0], [1, 2]], block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS
        )


# Three decodes sharing the 8 tokens of blocks [7, 2], then their own blocks (two contexts end
# inside a block of their own, one right after the shared blocks), and a prefill on the same
# prefix that must not take part in the cascade.
SHARING_SEQUENCES = [
    (12, 1, [7, 2, 30, 6]),
    (9, 1, [7, 2, 5]),
    (8, 1, [7, 2, 11]),
    (8, 3, [7, 2, 19]),
]


@pytest.fixture
def cascade_from_one_block(monkeypatch):
    """Cascade attention from one shared block on (the real threshold suits real models)."""
    monkeypatch.setattr(attention_metadata, "CASCADE_MIN_SHARED_TOKENS", BLOCK_SIZE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decodes_sharing_leading_blocks_attend_them_once_and_match_dense_attention(
    cascade_from_one_block, dtype
):
    out, expected, metadata, *_ = _run_batch(SHARING_SEQUENCES, dtype, num_shared_tokens=8)
    heads = torch.arange(NUM_KV_HEADS)[:, None]
    shared_rows = (torch.tensor([7, 2]) * NUM_KV_HEADS + heads).flatten()
    assert metadata.decode_shared_gather_index.tolist() == shared_rows.tolist()
    assert metadata.max_decode_context_len == 13 - 8  # the longest decode's own tokens
    tolerance = 1e-5 if dtype is torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), expected.float(), atol=tolerance, rtol=tolerance)


def test_cascade_decode_attention_reads_an_int8_cache_like_the_plain_path(
    cascade_from_one_block, monkeypatch
):
    def run():
        torch.manual_seed(1)
        caches = [torch.randn(NUM_BLOCKS, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM) for _ in range(2)]
        codes, scales = zip(*(quantize_kv(cache) for cache in caches), strict=True)
        metadata = _metadata_of(SHARING_SEQUENCES[:3])
        q = torch.randn(3, NUM_HEADS, HEAD_DIM)
        k, v = torch.randn(2, 3, NUM_KV_HEADS, HEAD_DIM)
        return metadata, paged_attention(
            q, k, v, codes[0].clone(), codes[1].clone(), metadata, scale=SCALE, kv_scales=scales
        )

    cascade_metadata, cascade = run()
    monkeypatch.setattr(attention_metadata, "CASCADE_MIN_SHARED_TOKENS", 10**9)
    plain_metadata, plain = run()
    assert cascade_metadata.decode_shared_gather_index is not None
    assert plain_metadata.decode_shared_gather_index is None
    torch.testing.assert_close(cascade, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("sequences", "reason"),
    [
        ([(12, 1, [7, 2, 30, 6])], "a single decode"),
        ([(12, 1, [7, 2, 30, 6]), (9, 1, [8, 2, 5])], "no common first block"),
        ([(3, 1, [7]), (3, 1, [7])], "the common block holds the new tokens"),
    ],
)
def test_decodes_without_full_shared_blocks_are_attended_in_one_part(
    cascade_from_one_block, sequences, reason
):
    metadata = _metadata_of(sequences)
    assert metadata.decode_shared_gather_index is None, reason


def test_shared_prefixes_shorter_than_the_threshold_are_not_cascaded():
    assert attention_metadata.CASCADE_MIN_SHARED_TOKENS > 2 * BLOCK_SIZE
    metadata = build_attention_metadata(
        [1, 1], [12, 9], [[7, 2, 30, 6], [7, 2, 5]], block_size=BLOCK_SIZE, num_kv_heads=2
    )
    assert metadata.decode_shared_gather_index is None


# ---- sliding windows ----


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 3, 6])
def test_sliding_window_batch_matches_dense_attention_within_the_window(window, dtype):
    out, expected, metadata, *_ = _run_batch(SEQUENCES, dtype, window=window)
    assert metadata.windowed[window] is not metadata
    tolerance = 1e-5 if dtype is torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), expected.float(), atol=tolerance, rtol=tolerance)


def test_sliding_window_view_reads_from_the_block_holding_the_first_visible_position():
    # a decode at position 9 with a window of 3 sees positions 7-9: blocks 1-2 of its table
    # [7, 2, 30]; a chunk at positions 5-11 sees 3 positions back from 5: from block 0 (of 4)
    metadata = _metadata_of([(9, 1, [7, 2, 30]), (5, 7, [25, 1, 14, 8])], windows=(3, 6))
    view = metadata.windowed[3]
    heads = torch.arange(NUM_KV_HEADS)[:, None]
    expected_rows = (torch.tensor([2, 30]) * NUM_KV_HEADS + heads).flatten()
    assert view.decode_gather_index.tolist() == expected_rows.tolist()
    assert view.decode_mask.flatten().tolist() == [False] * 3 + [True] * 3  # positions 4-9
    assert view.prefills[0].num_context_tokens == 12
    assert metadata.windowed[6].prefills[0].num_context_tokens == 12
    # the views share the step's cache writes
    assert view.write_index is metadata.write_index


def test_a_window_no_context_reaches_past_is_served_by_the_metadata_itself():
    metadata = _metadata_of([(2, 1, [5]), (0, 3, [11])], windows=(4,))
    assert metadata.windowed[4] is metadata


@pytest.mark.parametrize("window", [3, 6])
def test_windowed_decodes_sharing_leading_blocks_match_dense_attention(
    cascade_from_one_block, window
):
    out, expected, metadata, *_ = _run_batch(SHARING_SEQUENCES, num_shared_tokens=8, window=window)
    assert metadata.decode_shared_gather_index is not None  # the global layers' cascade
    assert metadata.windowed[window].decode_shared_gather_index is None
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_windowed_attention_reads_an_int8_cache_like_its_dequantized_values():
    torch.manual_seed(1)
    caches = [torch.randn(NUM_BLOCKS, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM) for _ in range(2)]
    codes, scales = zip(*(quantize_kv(cache) for cache in caches), strict=True)
    dequantized = [(c.float() * s.unsqueeze(-1)) for c, s in zip(codes, scales, strict=True)]
    sequences = [(9, 1, [7, 2, 30]), (2, 1, [5]), (5, 7, [25, 1, 14, 8])]
    q = torch.randn(9, NUM_HEADS, HEAD_DIM)
    k, v = torch.randn(2, 9, NUM_KV_HEADS, HEAD_DIM)
    # NOTE: the new keys/values are quantized on write, so the float run gets them rounded too
    k = quantize_kv(k)[0].float() * quantize_kv(k)[1].unsqueeze(-1)
    v = quantize_kv(v)[0].float() * quantize_kv(v)[1].unsqueeze(-1)
    int8 = paged_attention(
        q,
        k,
        v,
        codes[0].clone(),
        codes[1].clone(),
        _metadata_of(sequences, (3,)),
        scale=SCALE,
        kv_scales=scales,
        sliding_window=3,
    )
    plain = paged_attention(
        q,
        k,
        v,
        dequantized[0],
        dequantized[1],
        _metadata_of(sequences, (3,)),
        scale=SCALE,
        sliding_window=3,
    )
    torch.testing.assert_close(int8, plain, atol=1e-5, rtol=1e-5)


def test_a_window_the_metadata_was_not_built_for_is_refused():
    metadata = _metadata_of([(9, 1, [7, 2, 30])], windows=(3,))
    q = torch.randn(1, NUM_HEADS, HEAD_DIM)
    k, v = torch.randn(2, 1, NUM_KV_HEADS, HEAD_DIM)
    caches = torch.zeros(2, NUM_BLOCKS, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM)
    with pytest.raises(ValueError, match="no view for a sliding window of 5"):
        paged_attention(q, k, v, *caches, metadata, scale=SCALE, sliding_window=5)
