"""Paged attention in plain PyTorch (CPU, and CUDA without special kernels), or with the native
paged decode kernel where the metadata says so (kernels/paged_decode_attention.py).

Each layer's KV cache is a pair of tensors [num_blocks, num_kv_heads, block_size, head_dim]; token
`i` of a sequence lives at offset `i % block_size` of block `block_table[i // block_size]`.

NOTE: head-major blocks (not [num_blocks, block_size, num_kv_heads, head_dim]) because attention
reads the cache per KV head: gathering a sequence's blocks then yields [kv_heads, tokens, dim]
runs that SDPA takes without another copy. Measured on the 2-core dev box (32 decodes at ~1,250
context, per layer): gather + SDPA 10.8 ms head-major vs 17.2 ms token-major in bf16, 14.8 vs
18.8 ms in fp32.

With the indices of metadata.py:
- all decodes run as ONE gather of their blocks plus ONE scaled-dot-product-attention call, padded
  to the longest context with a key mask (a Python loop over sequences would cost per-sequence
  overhead in every layer); in cascade, the shared blocks are attended once by all decodes'
  queries and merged with each decode's own part by their log-sum-exp;
- each multi-token sequence (a prefill chunk) runs its own SDPA call, causal inside the chunk and
  offset by the tokens already cached; or, where the metadata was built for it, the native
  prefill kernel reads its context from the cache (kernels/paged_prefill_attention.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inference.engine.kernels import paged_decode_attention as paged_decode_kernel
from inference.engine.kernels import paged_prefill_attention as paged_prefill_kernel
from inference.engine.kv_cache import dequantize_kv, quantize_kv
from inference.engine.layers.attention.metadata import AttentionMetadata

# The CPU flash-attention kernel behind F.scaled_dot_product_attention; it also returns the
# log-sum-exp [batch, heads, queries] (float32) that merging two partial attentions needs.
_flash_attention_with_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    *,
    scale: float,
    kv_scales: tuple[torch.Tensor, ...] = (),
    is_kv_stored: bool = False,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Store k/v [num_tokens, num_kv_heads, head_dim] in the cache, then attend.

    `is_kv_stored`: the caller already wrote k/v to the cache (kernels/rotary_store.py).
    `sliding_window`: each query attends only that many positions back, itself included (the
    metadata must have been built with this window).

    q is [num_tokens, num_heads, head_dim]; returns [num_tokens, num_heads, head_dim]. Query head
    h uses KV head h // (num_heads // num_kv_heads), as in transformers' repeat_kv.
    `kv_scales` (key scales, value scales) [num_blocks, num_kv_heads, block_size] make the
    caches int8: written quantized, read dequantized to q's dtype (see kv_cache.py).
    """
    num_tokens, num_heads, head_dim = q.shape
    if kv_scales and not is_kv_stored:
        _write_quantized(k_cache, kv_scales[0], k, metadata.write_index)
        _write_quantized(v_cache, kv_scales[1], v, metadata.write_index)
    elif not is_kv_stored:
        k_cache.view(-1, head_dim).index_copy_(0, metadata.write_index, k.reshape(-1, head_dim))
        v_cache.view(-1, head_dim).index_copy_(0, metadata.write_index, v.reshape(-1, head_dim))

    if sliding_window is not None:
        if sliding_window not in metadata.windowed:
            raise ValueError(
                f"the step's metadata has no view for a sliding window of {sliding_window} "
                "(build_attention_metadata(sliding_windows=...))"
            )
        metadata = metadata.windowed[sliding_window]
    num_decodes = metadata.num_decode_tokens
    if num_decodes == num_tokens:  # pure decode step: no output buffer to assemble
        return _decode_attention(q, k_cache, v_cache, metadata, scale, kv_scales)
    out = q.new_empty(num_tokens, num_heads, head_dim)
    if num_decodes:
        out[:num_decodes] = _decode_attention(
            q[:num_decodes], k_cache, v_cache, metadata, scale, kv_scales
        )
    for span in metadata.prefills:
        start, end = span.query_start, span.query_start + span.num_query_tokens
        if span.block_table is not None and span.query_positions is not None:
            if kv_scales:
                raise ValueError("the native prefill kernel reads bf16 caches, not int8 ones")
            paged_prefill_kernel.paged_prefill_attention(
                q[start:end],
                k_cache,
                v_cache,
                span.block_table,
                span.query_positions,
                scale,
                out[start:end],
            )
            continue
        if span.gather_index is None:
            keys = k[start:end].transpose(0, 1)
            values = v[start:end].transpose(0, 1)
        elif kv_scales:
            keys = _gather_quantized(k_cache, kv_scales[0], span.gather_index, q.dtype)
            values = _gather_quantized(v_cache, kv_scales[1], span.gather_index, q.dtype)
            keys = keys[:, : span.num_context_tokens]
            values = values[:, : span.num_context_tokens]
        else:
            keys = _gather(k_cache, span.gather_index)[:, : span.num_context_tokens]
            values = _gather(v_cache, span.gather_index)[:, : span.num_context_tokens]
        # NOTE: the mask additive, made once for all layers: SDPA turns a bool mask into one
        # on every call (the same results; attention over 1,264 keys 2-20% faster without).
        if span.mask is not None and span.additive_mask is None:
            span.additive_mask = _additive_mask(span.mask, q.dtype)
        # [heads, tokens, dim] with a batch axis of 1
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1).unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=span.additive_mask,
            is_causal=span.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = o[0].transpose(0, 1)
    return out


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool attention mask (True = attend) as the additive one SDPA adds to its scores."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )


def _gather(cache: torch.Tensor, gather_index: torch.Tensor) -> torch.Tensor:
    """One sequence's blocks as [kv_heads, num_blocks * block_size, head_dim]."""
    num_kv_heads, block_size, head_dim = cache.shape[1:]
    rows = cache.view(-1, block_size, head_dim).index_select(0, gather_index)
    return rows.view(num_kv_heads, -1, head_dim)


def _write_quantized(
    cache: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, write_index: torch.Tensor
) -> None:
    """Quantize x [num_tokens, num_kv_heads, head_dim] into an int8 cache and its scales."""
    head_dim = cache.shape[-1]
    codes, row_scales = quantize_kv(x.reshape(-1, head_dim))
    cache.view(-1, head_dim).index_copy_(0, write_index, codes)
    scales.view(-1).index_copy_(0, write_index, row_scales.to(scales.dtype))


def _gather_quantized(
    cache: torch.Tensor, scales: torch.Tensor, gather_index: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """`_gather` of an int8 cache, dequantized to `dtype`."""
    num_kv_heads, block_size, head_dim = cache.shape[1:]
    codes = cache.view(-1, block_size, head_dim).index_select(0, gather_index)
    row_scales = scales.view(-1, block_size).index_select(0, gather_index)
    return dequantize_kv(codes, row_scales, dtype).view(num_kv_heads, -1, head_dim)


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    kv_scales: tuple[torch.Tensor, ...] = (),
) -> torch.Tensor:
    num_decodes, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    # NOTE: the query heads sharing one KV head become the "query length" axis of that KV head,
    # so grouped-query attention needs no repeated keys/values: [seqs, kv_heads, group, dim].
    # (4x faster here than SDPA's enable_gqa with one query token.)
    grouped_q = q.reshape(num_decodes, num_kv_heads, num_heads // num_kv_heads, head_dim)
    shared_index = metadata.decode_shared_gather_index
    block_table, context_lens = metadata.decode_block_table, metadata.decode_context_lens
    if block_table is not None and context_lens is not None:
        if kv_scales:
            raise ValueError("the native decode kernel reads bf16 caches, not int8 ones")
        own, own_lse = paged_decode_kernel.paged_decode_attention(
            grouped_q.contiguous(),
            k_cache,
            v_cache,
            block_table,
            context_lens,
            scale,
            with_lse=shared_index is not None,
        )
        if shared_index is None:
            return own.to(q.dtype).reshape(num_decodes, num_heads, head_dim)
    else:
        keys, values = _gather_decode_kv(
            k_cache, v_cache, metadata, num_decodes, q.dtype, kv_scales
        )
        if shared_index is None:
            o = F.scaled_dot_product_attention(
                grouped_q, keys, values, attn_mask=metadata.decode_mask, scale=scale
            )
            return o.reshape(num_decodes, num_heads, head_dim)
        if metadata.decode_mask is not None and metadata.decode_additive_mask is None:
            metadata.decode_additive_mask = _additive_mask(metadata.decode_mask, q.dtype)
        own, own_lse = _flash_attention_with_lse(
            grouped_q, keys, values, attn_mask=metadata.decode_additive_mask, scale=scale
        )
    # The shared blocks: one sequence's worth of keys/values, attended by every decode's queries
    # as one long query axis per KV head: [1, kv_heads, seqs * group, dim].
    if kv_scales:
        shared_keys = _gather_quantized(k_cache, kv_scales[0], shared_index, q.dtype)
        shared_values = _gather_quantized(v_cache, kv_scales[1], shared_index, q.dtype)
    else:
        shared_keys = _gather(k_cache, shared_index)
        shared_values = _gather(v_cache, shared_index)
    shared, shared_lse = _flash_attention_with_lse(
        grouped_q.transpose(0, 1).reshape(1, num_kv_heads, -1, head_dim),
        shared_keys.unsqueeze(0),
        shared_values.unsqueeze(0),
        scale=scale,
    )
    shared = shared.view(num_kv_heads, num_decodes, -1, head_dim).transpose(0, 1)
    shared_lse = shared_lse.view(num_kv_heads, num_decodes, -1).transpose(0, 1)
    # softmax over the union of both key sets = the two partial results weighted by their
    # share of the total exp-sum: sigmoid(lse_shared - lse_own) for the shared part.
    shared_weight = torch.sigmoid(shared_lse - own_lse).unsqueeze(-1)
    o = torch.lerp(own.float(), shared.float(), shared_weight)
    return o.to(q.dtype).reshape(num_decodes, num_heads, head_dim)


def _gather_decode_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    num_decodes: int,
    dtype: torch.dtype,
    kv_scales: tuple[torch.Tensor, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each decode's own blocks as keys/values [num_decodes, kv_heads, context, head_dim]."""
    num_kv_heads, block_size, head_dim = k_cache.shape[1:]
    index = metadata.decode_gather_index
    if index is None:
        raise ValueError("the metadata has no gather index for the decodes (native kernel's?)")
    keys, values = metadata.decode_keys, metadata.decode_values
    if keys is None or values is None:
        # NOTE: one buffer pair per step, reused by every layer: no per-layer allocation (and
        # page faults) for what is the largest tensor of a decode step.
        keys = metadata.decode_keys = k_cache.new_empty(len(index), block_size, head_dim)
        values = metadata.decode_values = v_cache.new_empty(len(index), block_size, head_dim)
    flat_shape = (-1, block_size, head_dim)
    torch.index_select(k_cache.view(flat_shape), 0, index, out=keys)
    torch.index_select(v_cache.view(flat_shape), 0, index, out=values)
    if kv_scales:
        keys = dequantize_kv(keys, kv_scales[0].view(-1, block_size).index_select(0, index), dtype)
        values = dequantize_kv(
            values, kv_scales[1].view(-1, block_size).index_select(0, index), dtype
        )
    context_len = metadata.max_decode_context_len
    keys = keys.view(num_decodes, num_kv_heads, -1, head_dim)[:, :, :context_len]
    values = values.view(num_decodes, num_kv_heads, -1, head_dim)[:, :, :context_len]
    return keys, values
