"""Paged attention in plain PyTorch (CPU, and CUDA without special kernels).

Each layer's KV cache is a pair of tensors [num_blocks, num_kv_heads, block_size, head_dim]; token
`i` of a sequence lives at offset `i % block_size` of block `block_table[i // block_size]`.

NOTE: head-major blocks (not [num_blocks, block_size, num_kv_heads, head_dim]) because attention
reads the cache per KV head: gathering a sequence's blocks then yields [kv_heads, tokens, dim]
runs that SDPA takes without another copy. Measured on the 2-core dev box (32 decodes at ~1,250
context, per layer): gather + SDPA 10.8 ms head-major vs 17.2 ms token-major in bf16, 14.8 vs
18.8 ms in fp32.

One step's tokens arrive as a flat batch with the single-token sequences (decodes) first:
- all decodes run as ONE gather of their blocks plus ONE scaled-dot-product-attention call, padded
  to the longest context with a key mask (a Python loop over sequences would cost per-sequence
  overhead in every layer);
- each multi-token sequence (a prefill chunk) runs its own SDPA call, causal inside the chunk and
  offset by the tokens already cached.
`build_attention_metadata` turns the batch layout into index tensors once per step; every layer
reuses them (and the gather buffers the first layer allocates).

Cascade decode attention (CPU): when the decodes of a step share leading KV blocks (the prefix
cache hands every chat the same blocks for the system prompt), those blocks are gathered ONCE
and attended by all decodes' queries in one call; each sequence then attends only its own blocks,
and the two partial results are merged by their log-sum-exp. Without it a step copies the shared
prompt once per sequence in every layer. Measured on the 2-core box (32 decodes of 1,250 tokens
sharing 1,008, bf16): a decode step went from 209 ms (gather 80 ms, SDPA 77 ms) to 99 ms.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inference.engine.kernels import paged_decode_attention as paged_decode_kernel
from inference.engine.kv_cache import dequantize_kv, quantize_kv

# Shared leading tokens of a step's decodes from which cascade attention pays (see the module doc).
CASCADE_MIN_SHARED_TOKENS = 64
# The CPU flash-attention kernel behind F.scaled_dot_product_attention; it also returns the
# log-sum-exp [batch, heads, queries] (float32) that merging two partial attentions needs.
_flash_attention_with_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass(slots=True)
class PrefillSpan:
    """One multi-token sequence of the batch."""

    query_start: int  # index of its first token in the flat batch
    num_query_tokens: int
    num_context_tokens: int  # cached tokens + query tokens
    # Rows of the cache viewed as [num_blocks * num_kv_heads, block_size, head_dim] holding the
    # context, ordered (head, block); None when nothing was cached before this chunk, in which
    # case attention runs over the chunk's own keys/values without reading the cache.
    gather_index: torch.Tensor | None
    mask: torch.Tensor | None  # [num_query_tokens, num_context_tokens] bool, True = attend


@dataclass(slots=True)
class AttentionMetadata:
    positions: torch.Tensor  # [num_tokens] int64, position of each token in its sequence
    slot_mapping: torch.Tensor  # [num_tokens] int64, block_id * block_size + offset
    # [num_tokens * num_kv_heads] rows of the cache viewed as [-1, head_dim] that receive the new
    # keys/values, token-major (matching k.reshape(-1, head_dim)).
    write_index: torch.Tensor
    num_decode_tokens: int  # the first num_decode_tokens tokens are single-token sequences
    # [num_decodes * kv_heads * max_blocks] cache rows, ordered (sequence, head, block), of each
    # decode's own blocks: all of them, or those after the shared prefix (cascade)
    decode_gather_index: torch.Tensor | None
    max_decode_context_len: int  # tokens those blocks hold for the longest decode
    # [num_decodes, 1, 1, max_decode_context_len]; None when all decodes have the same context
    decode_mask: torch.Tensor | None
    prefills: list[PrefillSpan]
    # Cascade: cache rows [kv_heads * shared blocks], ordered (head, block), of the leading
    # blocks every decode shares; None when the decodes are not attended in two parts.
    decode_shared_gather_index: torch.Tensor | None = None
    # Gather buffers shared by all layers of the step (allocated by the first layer).
    decode_keys: torch.Tensor | None = None
    decode_values: torch.Tensor | None = None
    # decode_mask as an additive mask in the model dtype (built by the first layer that needs it)
    decode_additive_mask: torch.Tensor | None = None
    # Native kernel (paged_decode_kernel.py) instead of gather + SDPA: each decode's own blocks
    # [num_decodes, max blocks] int32 and the tokens they hold [num_decodes] int32; when set,
    # decode_gather_index and decode_mask are None.
    decode_block_table: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None


def build_attention_metadata(
    query_lens: list[int],
    num_computed_tokens: list[int],
    block_tables: list[list[int]],
    *,
    block_size: int,
    num_kv_heads: int,
    device: torch.device | str = "cpu",
    decode_kernel: bool = False,
    cascade: bool = True,
) -> AttentionMetadata:
    """Index tensors for one step. Sequences with one query token must come first.

    Block tables may be longer than needed; only the blocks covering each context are used.
    `decode_kernel`: the decodes will be attended by the native kernel (the caller checked
    `paged_decode_kernel.supports`: a CPU bf16 cache that is not quantized).
    `cascade`: decodes sharing leading blocks attend them once, together (CPU); False makes
    every decode attend its whole context itself (what the fused decode path runs).
    """
    num_seqs = len(query_lens)
    num_decodes = 0
    while num_decodes < num_seqs and query_lens[num_decodes] == 1:
        num_decodes += 1
    if any(n == 1 for n in query_lens[num_decodes:]):
        raise ValueError("single-token sequences must come before multi-token ones")
    context_lens = [c + q for c, q in zip(num_computed_tokens, query_lens, strict=True)]
    num_blocks = [(n + block_size - 1) // block_size for n in context_lens]
    max_blocks = max(num_blocks)

    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    computed = torch.tensor(num_computed_tokens, dtype=torch.int64)
    blocks_t = torch.tensor(num_blocks, dtype=torch.int64)
    # NOTE: one flat list -> tensor -> masked scatter is much cheaper than a nested list of
    # padded rows; padding entries point at block 0 and are masked out (or sliced away).
    flat_blocks = torch.tensor(
        list(
            itertools.chain.from_iterable(
                t[:n] for t, n in zip(block_tables, num_blocks, strict=True)
            )
        ),
        dtype=torch.int64,
    )
    table = torch.zeros(num_seqs, max_blocks, dtype=torch.int64)
    table[torch.arange(max_blocks) < blocks_t[:, None]] = flat_blocks

    num_tokens = sum(query_lens)
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs), q_lens, output_size=num_tokens)
    first_token = torch.cumsum(q_lens, 0) - q_lens
    positions = torch.arange(num_tokens) - first_token[seq_of_token] + computed[seq_of_token]
    block_of_token = table[seq_of_token, positions // block_size]
    offset_in_block = positions % block_size
    slot_mapping = block_of_token * block_size + offset_in_block
    heads = torch.arange(num_kv_heads)
    write_index = (
        (block_of_token[:, None] * num_kv_heads + heads) * block_size + offset_in_block[:, None]
    ).flatten()

    decode_gather_index = decode_mask = decode_shared_gather_index = None
    decode_block_table = decode_context_lens = None
    max_decode_context_len = 0
    if num_decodes:
        decode_table = table[:num_decodes, : max(num_blocks[:num_decodes])]
        decode_lens = computed[:num_decodes] + 1
        num_shared_blocks = 0
        if cascade and torch.device(device).type == "cpu":
            num_shared_blocks = _num_shared_blocks(decode_table, decode_lens, block_size)
        if num_shared_blocks:
            shared_table = decode_table[0, :num_shared_blocks]
            decode_shared_gather_index = (shared_table * num_kv_heads + heads[:, None]).flatten()
            decode_table = decode_table[:, num_shared_blocks:]
            decode_lens = decode_lens - num_shared_blocks * block_size
        max_decode_context_len = int(decode_lens.max())
        if decode_kernel:
            decode_block_table = decode_table.to(torch.int32).contiguous()
            decode_context_lens = decode_lens.to(torch.int32)
        else:
            decode_gather_index = decode_table[:, None, :] * num_kv_heads + heads[:, None]
            decode_gather_index = decode_gather_index.flatten().to(device)
            if int(decode_lens.min()) != max_decode_context_len:
                decode_mask = torch.arange(max_decode_context_len) < decode_lens[:, None]
                decode_mask = decode_mask.view(num_decodes, 1, 1, -1).to(device)

    prefills = []
    starts = first_token.tolist()
    for i in range(num_decodes, num_seqs):
        computed_i, query_i = num_computed_tokens[i], query_lens[i]
        gather_index = mask = None
        if computed_i:
            gather_index = (table[i, : num_blocks[i]] * num_kv_heads + heads[:, None]).flatten()
            gather_index = gather_index.to(device)
            # NOTE: query token j sits at position computed_i + j and sees keys up to it.
            query_positions = torch.arange(computed_i, computed_i + query_i)
            mask = torch.arange(computed_i + query_i) <= query_positions[:, None]
            mask = mask.to(device)
        prefills.append(PrefillSpan(starts[i], query_i, computed_i + query_i, gather_index, mask))

    return AttentionMetadata(
        positions=positions.to(device),
        slot_mapping=slot_mapping.to(device),
        write_index=write_index.to(device),
        num_decode_tokens=num_decodes,
        decode_gather_index=decode_gather_index,
        max_decode_context_len=max_decode_context_len,
        decode_mask=decode_mask,
        prefills=prefills,
        decode_shared_gather_index=decode_shared_gather_index,
        decode_block_table=decode_block_table,
        decode_context_lens=decode_context_lens,
    )


def _num_shared_blocks(
    decode_table: torch.Tensor, decode_lens: torch.Tensor, block_size: int
) -> int:
    """Leading blocks that every decode's table holds, if enough to attend them once (cascade).

    Only blocks entirely before each decode's new token count: those are full and read-only, so
    every query attends all of their tokens and no mask is needed.
    """
    if len(decode_table) < 2:
        return 0
    is_common = (decode_table == decode_table[0]).all(dim=0)
    num_common = int(is_common.cumprod(dim=0).sum())
    num_shared = min(num_common, int((decode_lens.min() - 1) // block_size))
    return num_shared if num_shared * block_size >= CASCADE_MIN_SHARED_TOKENS else 0


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
) -> torch.Tensor:
    """Store k/v [num_tokens, num_kv_heads, head_dim] in the cache, then attend.

    `is_kv_stored`: the caller already wrote k/v to the cache (native_rotary.py).

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
        # [heads, tokens, dim] with a batch axis of 1
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1).unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=span.mask,
            is_causal=span.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = o[0].transpose(0, 1)
    return out


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
    is_cascade = metadata.decode_shared_gather_index is not None
    if metadata.decode_block_table is not None:
        if kv_scales:
            raise ValueError("the native decode kernel reads bf16 caches, not int8 ones")
        own, own_lse = paged_decode_kernel.paged_decode_attention(
            grouped_q.contiguous(),
            k_cache,
            v_cache,
            metadata.decode_block_table,
            metadata.decode_context_lens,
            scale,
            with_lse=is_cascade,
        )
        if not is_cascade:
            return own.to(q.dtype).reshape(num_decodes, num_heads, head_dim)
    else:
        keys, values = _gather_decode_kv(
            k_cache, v_cache, metadata, num_decodes, q.dtype, kv_scales
        )
        if not is_cascade:
            o = F.scaled_dot_product_attention(
                grouped_q, keys, values, attn_mask=metadata.decode_mask, scale=scale
            )
            return o.reshape(num_decodes, num_heads, head_dim)
        if metadata.decode_mask is not None and metadata.decode_additive_mask is None:
            metadata.decode_additive_mask = torch.zeros(
                metadata.decode_mask.shape, dtype=q.dtype, device=q.device
            ).masked_fill_(~metadata.decode_mask, float("-inf"))
        own, own_lse = _flash_attention_with_lse(
            grouped_q, keys, values, attn_mask=metadata.decode_additive_mask, scale=scale
        )
    # The shared blocks: one sequence's worth of keys/values, attended by every decode's queries
    # as one long query axis per KV head: [1, kv_heads, seqs * group, dim].
    shared_index = metadata.decode_shared_gather_index
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
    if metadata.decode_keys is None:
        # NOTE: one buffer pair per step, reused by every layer: no per-layer allocation (and
        # page faults) for what is the largest tensor of a decode step.
        metadata.decode_keys = k_cache.new_empty(len(index), block_size, head_dim)
        metadata.decode_values = v_cache.new_empty(len(index), block_size, head_dim)
    flat_shape = (-1, block_size, head_dim)
    torch.index_select(k_cache.view(flat_shape), 0, index, out=metadata.decode_keys)
    torch.index_select(v_cache.view(flat_shape), 0, index, out=metadata.decode_values)
    keys, values = metadata.decode_keys, metadata.decode_values
    if kv_scales:
        keys = dequantize_kv(keys, kv_scales[0].view(-1, block_size).index_select(0, index), dtype)
        values = dequantize_kv(
            values, kv_scales[1].view(-1, block_size).index_select(0, index), dtype
        )
    context_len = metadata.max_decode_context_len
    keys = keys.view(num_decodes, num_kv_heads, -1, head_dim)[:, :, :context_len]
    values = values.view(num_decodes, num_kv_heads, -1, head_dim)[:, :, :context_len]
    return keys, values
