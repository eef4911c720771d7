"""The native paged decode-attention kernel against a float64 reference and the PyTorch path,
bf16 and float32 caches, at every instruction set level the CPU has."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from inference.engine.kernels import paged_decode_attention as paged_decode_kernel
from inference.engine.layers.attention import build_attention_metadata, paged_attention
from inference.engine.model_runner import BatchEntry
from tests.engine.real_model import native_dtype_runner

pytestmark = pytest.mark.skipif(
    not paged_decode_kernel.is_supported(torch.bfloat16, torch.device("cpu"), 1, 1, 64, 16),
    reason="the native kernel needs a CPU with AVX2, AVX-512 or NEON and a C compiler",
)

# bf16 inputs; the kernel rounds the probabilities to bf16 before the value sum (as PyTorch's
# flash kernel does), so results are ~1e-3 from an exact softmax. float32: ~1e-6.
TOLERANCE = 4e-3
FLOAT32_TOLERANCE = 2e-5


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE if dtype == torch.bfloat16 else FLOAT32_TOLERANCE


def close_in_bf16(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to the rounding of two bf16 outputs (8 significant bits): ~2 units each."""
    return torch.allclose(a.float(), b.float(), atol=TOLERANCE, rtol=2**-6)


def random_cache(
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    head_dim: int,
    seed: int,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    keys = torch.randn(shape, generator=generator).to(dtype)
    values = torch.randn(shape, generator=generator).to(dtype)
    return keys, values


def reference(grouped_q, k_cache, v_cache, block_tables, context_lens, scale):
    """float64 softmax attention of each sequence over its blocks: output and log-sum-exp."""
    block_size = k_cache.shape[2]
    outputs, lses = [], []
    for seq, length in enumerate(context_lens):
        blocks = torch.tensor(block_tables[seq][: math.ceil(length / block_size)])
        keys = k_cache[blocks].transpose(0, 1).flatten(1, 2)[:, :length].double()
        values = v_cache[blocks].transpose(0, 1).flatten(1, 2)[:, :length].double()
        scores = torch.einsum("hgd,htd->hgt", grouped_q[seq].double(), keys) * scale
        outputs.append(torch.einsum("hgt,htd->hgd", scores.softmax(-1), values))
        lses.append(scores.logsumexp(-1))
    return torch.stack(outputs), torch.stack(lses)


def scattered_block_tables(
    context_lens: list[int], block_size: int, num_blocks: int, generator: torch.Generator
) -> list[list[int]]:
    """A block table per context: distinct blocks in random, non-contiguous order."""
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables, start = [], 0
    for length in context_lens:
        count = math.ceil(length / block_size)
        tables.append(order[start : start + count])
        start += count
    return tables


def run_kernel(grouped_q, k_cache, v_cache, block_tables, context_lens, scale):
    width = max(len(t) for t in block_tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32)
    return paged_decode_attention_call(grouped_q, k_cache, v_cache, table, context_lens, scale)


def paged_decode_attention_call(grouped_q, k_cache, v_cache, table, context_lens, scale):
    return paged_decode_kernel.paged_decode_attention(
        grouped_q,
        k_cache,
        v_cache,
        table,
        torch.tensor(context_lens, dtype=torch.int32),
        scale,
        with_lse=True,
    )


@pytest.mark.parametrize(
    ("group", "head_dim", "block_size"),
    [(1, 64, 16), (3, 64, 16), (4, 128, 16), (8, 64, 32), (5, 96, 16), (16, 32, 16)],
)
def test_kernel_matches_exact_softmax_attention_for_each_shape(
    group, head_dim, block_size, isa_level, dtype
):
    num_kv_heads, num_blocks = 2, 64
    k_cache, v_cache = random_cache(
        num_blocks, num_kv_heads, block_size, head_dim, seed=group, dtype=dtype
    )
    # 1 token, a partial first tile, exactly one block, one past a block, a long context
    context_lens = [1, 7, block_size, block_size + 1, 20 * block_size - 3]
    generator = torch.Generator().manual_seed(head_dim)
    tables = scattered_block_tables(context_lens, block_size, num_blocks, generator)
    q = torch.randn(len(context_lens), num_kv_heads, group, head_dim, generator=generator)
    q = q.to(dtype)
    out, lse = run_kernel(q, k_cache, v_cache, tables, context_lens, head_dim**-0.5)
    expected, expected_lse = reference(q, k_cache, v_cache, tables, context_lens, head_dim**-0.5)
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), expected, atol=tolerance(dtype), rtol=0)
    assert torch.allclose(lse.double(), expected_lse, atol=1e-4, rtol=0)


def test_a_single_long_sequence_is_split_into_partitions_that_merge_exactly(isa_level, dtype):
    # One sequence and one KV head: the context is split across threads (flash-decoding).
    k_cache, v_cache = random_cache(128, 1, 16, 64, seed=7, dtype=dtype)
    table = [list(range(127, 0, -1))]
    q = torch.randn(1, 1, 3, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out, lse = run_kernel(q, k_cache, v_cache, table, [2000], 0.125)
    finally:
        torch.set_num_threads(previous)
    expected, expected_lse = reference(q, k_cache, v_cache, table, [2000], 0.125)
    assert torch.allclose(out.double(), expected, atol=tolerance(dtype), rtol=0)
    assert torch.allclose(lse.double(), expected_lse, atol=1e-4, rtol=0)


def test_rows_past_the_context_are_never_read_even_when_they_hold_nan(isa_level, dtype):
    k_cache, v_cache = random_cache(4, 1, 16, 64, seed=1, dtype=dtype)
    k_cache[0, :, 5:] = float("nan")
    v_cache[0, :, 5:] = float("nan")
    q = torch.randn(1, 1, 2, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    out, _ = run_kernel(q, k_cache, v_cache, [[0]], [5], 0.125)
    expected, _ = reference(q, k_cache, v_cache, [[0]], [5], 0.125)
    assert not out.isnan().any()
    assert torch.allclose(out.double(), expected, atol=tolerance(dtype), rtol=0)


def test_shapes_the_kernel_does_not_support_are_refused():
    assert not paged_decode_kernel.is_supported(torch.float16, torch.device("cpu"), 9, 3, 64, 16)
    assert not paged_decode_kernel.is_supported(torch.bfloat16, torch.device("cpu"), 9, 3, 48, 16)
    assert not paged_decode_kernel.is_supported(torch.bfloat16, torch.device("cpu"), 9, 3, 64, 8)
    assert not paged_decode_kernel.is_supported(torch.bfloat16, torch.device("cpu"), 34, 2, 64, 16)
    assert not paged_decode_kernel.is_supported(torch.bfloat16, torch.device("meta"), 9, 3, 64, 16)
    k_cache, v_cache = random_cache(2, 1, 16, 48, seed=0)
    q = torch.zeros(1, 1, 1, 48, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim 48"):
        run_kernel(q, k_cache, v_cache, [[0]], [3], 0.1)
    with pytest.raises(ValueError, match="int32"):
        paged_decode_kernel.paged_decode_attention(
            q, k_cache, v_cache, torch.zeros(1, 1, dtype=torch.int64), torch.ones(1), 0.1
        )
    with pytest.raises(ValueError, match="must share a dtype"):
        run_kernel(q.float(), k_cache, v_cache, [[0]], [3], 0.1)


# --- through paged_attention: the engine's layout, cascade and mixed batches ----------------


def attention_both_ways(query_lens, computed, tables, *, num_heads=9, num_kv_heads=3, seed=0):
    """paged_attention's output with the kernel and with gather + SDPA (bf16 caches)."""
    head_dim, block_size = 64, 16
    num_tokens = sum(query_lens)
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=generator).to(torch.bfloat16)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator).to(torch.bfloat16)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator).to(torch.bfloat16)
    results, metadatas = [], []
    for decode_kernel in (True, False):
        k_cache, v_cache = random_cache(96, num_kv_heads, block_size, head_dim, seed=seed)
        metadata = build_attention_metadata(
            query_lens,
            computed,
            tables,
            block_size=block_size,
            num_kv_heads=num_kv_heads,
            decode_kernel=decode_kernel,
        )
        results.append(paged_attention(q, k, v, k_cache, v_cache, metadata, scale=0.125))
        metadatas.append(metadata)
    return results, metadatas


def test_decodes_through_the_kernel_match_the_gather_path():
    tables = [list(range(i * 20, i * 20 + 20)) for i in range(4)]
    (kernel, torch_path), (metadata, _) = attention_both_ways([1] * 4, [3, 100, 250, 17], tables)
    assert metadata.decode_block_table is not None and metadata.decode_gather_index is None
    assert close_in_bf16(kernel, torch_path)


def test_cascade_attention_with_the_kernel_matches_the_gather_path():
    shared = list(range(8))  # 128 tokens every decode shares (a system prompt)
    tables = [shared + list(range(10 + i * 10, 20 + i * 10)) for i in range(5)]
    (kernel, torch_path), (metadata, _) = attention_both_ways(
        [1] * 5, [130, 140, 200, 129, 150], tables
    )
    assert metadata.decode_shared_gather_index is not None
    assert metadata.decode_context_lens.tolist() == [3, 13, 73, 2, 23]  # own tokens only
    assert close_in_bf16(kernel, torch_path)


def test_a_step_mixing_decodes_and_a_prefill_chunk_uses_the_kernel_for_the_decodes():
    tables = [list(range(i * 20, i * 20 + 20)) for i in range(3)]
    (kernel, torch_path), _ = attention_both_ways([1, 1, 40], [50, 9, 64], tables)
    assert close_in_bf16(kernel, torch_path)


# --- the real model ------------------------------------------------------------------------


@pytest.mark.real_weights
@pytest.mark.usefixtures("torch_threads_on_free_cores")
def test_real_model_decoding_through_the_kernel_is_as_accurate_as_the_gather_path(
    chat_model_dir, real_tokenizer
):
    # Teacher-forced decoding of English text, 4 sequences sharing a 256-token prefix (so the
    # cascade runs too), in this CPU's dtype: the kernel's next-token perplexity must equal the
    # PyTorch path's to bf16 noise, and its top-1 predictions must agree. Measured in bf16:
    # perplexity 10.372 (kernel) vs 10.373 (gather + SDPA) vs 10.342 (float32); top-1
    # agreement 97.7%.
    text = (Path(__file__).parents[2] / "data" / "squad_passages.txt").read_text()
    token_ids = real_tokenizer(text)["input_ids"]
    shared, own, steps, num_seqs, block_size = 256, 128, 64, 4, 16
    sequences = [
        token_ids[:shared] + token_ids[shared + i * 2000 : shared + i * 2000 + own + steps + 1]
        for i in range(num_seqs)
    ]
    blocks_per_seq = math.ceil((own + steps + 1) / block_size)
    tables = [
        list(range(shared // block_size))
        + list(range(100 + i * blocks_per_seq, 100 + (i + 1) * blocks_per_seq))
        for i in range(num_seqs)
    ]
    runner = native_dtype_runner(chat_model_dir, kv_cache_mb=128, max_model_len=1024)
    assert runner.block_size == block_size
    assert runner.uses_decode_kernel

    def decode(uses_kernel: bool) -> tuple[torch.Tensor, torch.Tensor]:
        runner.uses_decode_kernel = uses_kernel
        for sequence, table in zip(sequences, tables, strict=True):
            runner.execute([BatchEntry(sequence[: shared + own], 0, table)])
        losses, predictions = [], []
        for position in range(shared + own, shared + own + steps):
            entries = [
                BatchEntry([s[position]], position, t)
                for s, t in zip(sequences, tables, strict=True)
            ]
            logits = runner.execute(entries)
            targets = torch.tensor([s[position + 1] for s in sequences])
            losses.append(torch.nn.functional.cross_entropy(logits, targets, reduction="none"))
            predictions.append(logits.argmax(-1))
        return torch.stack(losses).mean().exp(), torch.stack(predictions)

    kernel_perplexity, kernel_predictions = decode(True)
    torch_perplexity, torch_predictions = decode(False)
    assert abs(kernel_perplexity / torch_perplexity - 1) < 0.01
    assert (kernel_predictions == torch_predictions).float().mean() >= 0.9
