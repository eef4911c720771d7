"""The native paged prefill-attention kernel against a float64 reference and the PyTorch path
(gather + SDPA), and the real model's prefill through it: bf16 where the CPU has AVX-512 BF16,
float32 at every instruction set level the CPU can run."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from inference.engine.kernels import paged_prefill_attention as paged_prefill_kernel
from inference.engine.layers.attention import build_attention_metadata, paged_attention
from inference.engine.model_runner import BatchEntry
from tests.engine.kernels.test_paged_decode_attention import close_in_bf16
from tests.engine.real_model import dtype_runner

CPU = torch.device("cpu")
BLOCK_SIZE = 16
# float32 results against the float64 reference: float32 sums over up to ~1,100 keys
FLOAT32_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def require_kernel(dtype: torch.dtype) -> None:
    if not paged_prefill_kernel.is_supported(dtype, CPU, 9, 3, 64):
        pytest.skip(
            f"the native prefill kernel does not serve {dtype} here (bf16 needs AVX-512 "
            "BF16; both need a C compiler)"
        )


@pytest.fixture
def kernel_dtype(dtype: torch.dtype, isa_level: str) -> torch.dtype:
    """bf16 at the levels that serve it, float32 at every level this CPU can run."""
    require_kernel(dtype)
    return dtype


def close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal up to the rounding of the kernel's dtype."""
    if actual.dtype == torch.bfloat16:
        return close_in_bf16(actual, expected)
    return torch.allclose(actual.double(), expected.double(), **FLOAT32_TOLERANCE)


def paged_inputs(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    context_len: int,
    num_queries: int,
    seed: int,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [num_queries, heads, dim], caches with the context in scattered blocks (NaN bits in
    every row past it and in the blocks no table names) and the block table (int32)."""
    generator = torch.Generator().manual_seed(seed)
    num_blocks = math.ceil(context_len / BLOCK_SIZE)
    shape = (num_blocks + 5, num_kv_heads, BLOCK_SIZE, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    table = torch.randperm(num_blocks + 5, generator=generator)[:num_blocks]
    keys = torch.randn(num_kv_heads, context_len, head_dim, generator=generator)
    values = torch.randn(num_kv_heads, context_len, head_dim, generator=generator)
    for position in range(context_len):
        block, offset = table[position // BLOCK_SIZE], position % BLOCK_SIZE
        k_cache[block, :, offset] = keys[:, position].to(dtype)
        v_cache[block, :, offset] = values[:, position].to(dtype)
    q = torch.randn(num_queries, num_heads, head_dim, generator=generator).to(dtype)
    return q, k_cache, v_cache, table.to(torch.int32)


def reference(q, k_cache, v_cache, table, positions, scale) -> torch.Tensor:
    """float64 softmax attention of each query over the positions up to its own."""
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    context = int(positions[-1]) + 1
    keys = k_cache[table.long()].transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :context]
    values = v_cache[table.long()].transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :context]
    group = q.shape[1] // num_kv_heads
    keys = keys.double().repeat_interleave(group, 0)
    values = values.double().repeat_interleave(group, 0)
    scores = torch.einsum("thd,hcd->thc", q.double(), keys) * scale
    visible = torch.arange(context)[None, None, :] <= positions.long()[:, None, None]
    weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("thc,hcd->thd", weights, values)


def run_kernel(q, k_cache, v_cache, table, positions, scale=0.125) -> torch.Tensor:
    out = torch.empty_like(q)
    paged_prefill_kernel.paged_prefill_attention(
        q, k_cache, v_cache, table, positions.to(torch.int32), scale, out
    )
    return out


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "num_cached", "num_queries"),
    [
        (9, 3, 64, 0, 40),  # a first chunk: causal over its own keys (SmolLM2's heads)
        (9, 3, 64, 1008, 77),  # a new turn after a cached system prompt
        (12, 2, 128, 37, 100),  # Qwen2.5-1.5B's heads; the context ends mid-block
        (14, 2, 64, 5, 3),  # Qwen2.5-0.5B's; fewer rows than a row block
        (4, 4, 96, 20, 33),  # no grouping; a head size without its own instance
        (2, 1, 256, 70, 9),  # the largest head size
    ],
)
def test_kernel_matches_exact_softmax_attention_for_each_shape(
    num_heads, num_kv_heads, head_dim, num_cached, num_queries, kernel_dtype
):
    context_len = num_cached + num_queries
    q, k_cache, v_cache, table = paged_inputs(
        num_heads,
        num_kv_heads,
        head_dim,
        context_len,
        num_queries,
        seed=head_dim + num_cached,
        dtype=kernel_dtype,
    )
    positions = torch.arange(num_cached, context_len)
    out = run_kernel(q, k_cache, v_cache, table, positions)
    assert out.dtype == kernel_dtype
    assert not out.isnan().any()  # the NaN rows past the context were never used
    expected = reference(q, k_cache, v_cache, table, positions, 0.125)
    assert close(out, expected)


def test_scattered_ascending_query_positions_each_attend_up_to_their_own(kernel_dtype):
    # A chunk-KV reuse blend: the recomputed tokens sit among positions the cache already holds.
    q, k_cache, v_cache, table = paged_inputs(9, 3, 64, 300, 6, seed=1, dtype=kernel_dtype)
    positions = torch.tensor([0, 1, 64, 65, 200, 299])
    out = run_kernel(q, k_cache, v_cache, table, positions)
    assert close(out, reference(q, k_cache, v_cache, table, positions, 0.125))


def test_a_tokens_attention_is_the_same_whatever_chunk_it_is_computed_in(kernel_dtype):
    # Chunked prefill and batching never change a token's result: each row's keys are taken in
    # the same groups from position 0, whichever other rows share its work item.
    q, k_cache, v_cache, table = paged_inputs(12, 2, 128, 400, 300, seed=2, dtype=kernel_dtype)
    positions = torch.arange(100, 400)
    whole = run_kernel(q, k_cache, v_cache, table, positions)
    pieces = [
        run_kernel(q[a:b], k_cache, v_cache, table, positions[a:b])
        for a, b in ((0, 7), (7, 150), (150, 300))
    ]
    assert torch.equal(whole, torch.cat(pieces))


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (12, 2, 128)])
def test_a_shared_prefix_is_attended_once_for_every_decode_with_its_log_sum_exp(
    num_heads, num_kv_heads, head_dim, kernel_dtype
):
    # Cascade decoding: 20 decodes' query heads over 96 shared tokens (6 full blocks).
    q, k_cache, v_cache, table = paged_inputs(
        num_heads, num_kv_heads, head_dim, 96, 20, seed=head_dim, dtype=kernel_dtype
    )
    out, lse = paged_prefill_kernel.paged_shared_prefix_attention(q, k_cache, v_cache, table, 0.125)
    assert out.dtype == lse.dtype == torch.float32 and lse.shape == (20, num_heads)
    last = torch.full((20,), 95)  # every decode sees every shared position
    expected = reference(q, k_cache, v_cache, table, last, 0.125)
    assert close(out.to(kernel_dtype), expected)
    keys = k_cache[table.long()].transpose(0, 1).reshape(num_kv_heads, -1, head_dim).double()
    keys = keys.repeat_interleave(num_heads // num_kv_heads, 0)
    scores = torch.einsum("thd,hcd->thc", q.double(), keys) * 0.125
    torch.testing.assert_close(lse.double(), scores.logsumexp(-1), rtol=0, atol=2e-3)


def test_bad_arguments_are_refused_before_the_kernel_reads_anything():
    require_kernel(torch.bfloat16)
    q, k_cache, v_cache, table = paged_inputs(9, 3, 64, 40, 8, seed=3)
    positions = torch.arange(32, 40, dtype=torch.int32)
    out = torch.empty_like(q)
    call = paged_prefill_kernel.paged_prefill_attention
    with pytest.raises(ValueError, match="does not cover"):
        call(q, k_cache, v_cache, table[:2], positions, 0.1, out)
    with pytest.raises(ValueError, match="positions for"):
        call(q, k_cache, v_cache, table, positions[:5], 0.1, out)
    with pytest.raises(ValueError, match="int32"):
        call(q, k_cache, v_cache, table.long(), positions, 0.1, out)
    with pytest.raises(ValueError, match="share a dtype"):
        call(q, k_cache.float(), v_cache.float(), table, positions, 0.1, out.float())
    heads_apart = q.transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(ValueError, match="contiguous"):
        call(heads_apart, k_cache, v_cache, table, positions, 0.1, out)
    assert not paged_prefill_kernel.is_supported(torch.float16, CPU, 9, 3, 64)
    assert not paged_prefill_kernel.is_supported(torch.bfloat16, CPU, 9, 3, 48)
    assert not paged_prefill_kernel.is_supported(torch.bfloat16, CPU, 9, 4, 64)
    assert not paged_prefill_kernel.is_supported(torch.bfloat16, torch.device("meta"), 9, 3, 64)


@pytest.mark.parametrize("level", ["avx512_vnni", "avx512", "avx2"])
def test_bf16_builds_without_avx512_bf16_serve_nothing_and_float32_builds_serve(level, monkeypatch):
    from inference.engine.kernels import ISA_ENVIRONMENT_VARIABLE, supported_isa_levels

    if level not in {isa.name for isa in supported_isa_levels()}:
        pytest.skip(f"this CPU cannot run the {level} build")
    monkeypatch.setenv(ISA_ENVIRONMENT_VARIABLE, level)
    assert not paged_prefill_kernel.is_supported(torch.bfloat16, CPU, 9, 3, 64)
    assert paged_prefill_kernel.is_supported(torch.float32, CPU, 9, 3, 64)
    # float32 is preferred where it was measured faster: the AVX-512 builds
    assert paged_prefill_kernel.is_preferred(torch.float32) == level.startswith("avx512")


# --- through paged_attention: the engine's metadata ----------------------------------------


def test_a_mixed_step_through_the_kernel_matches_the_gather_path(dtype):
    # Two decodes, a chunk after 70 cached tokens and a first chunk, in one step.
    require_kernel(dtype)
    num_heads, num_kv_heads, head_dim = 9, 3, 64
    query_lens, computed = [1, 1, 50, 40], [33, 90, 70, 0]
    tables = [list(range(i * 10, i * 10 + 10)) for i in range(4)]
    generator = torch.Generator().manual_seed(4)
    num_tokens = sum(query_lens)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=generator).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator).to(dtype)
    outputs = []
    for prefill_kernel in (True, False):
        generator = torch.Generator().manual_seed(5)
        shape = (40, num_kv_heads, BLOCK_SIZE, head_dim)
        k_cache = torch.randn(shape, generator=generator).to(dtype)
        v_cache = torch.randn(shape, generator=generator).to(dtype)
        metadata = build_attention_metadata(
            query_lens,
            computed,
            tables,
            block_size=BLOCK_SIZE,
            num_kv_heads=num_kv_heads,
            prefill_kernel=prefill_kernel,
            sliding_windows=(32,),
        )
        spans = metadata.prefills
        assert all((span.block_table is not None) == prefill_kernel for span in spans)
        # a sliding-window view keeps PyTorch's path (its spans start where the window does)
        assert all(span.block_table is None for span in metadata.windowed[32].prefills)
        outputs.append(paged_attention(q, k, v, k_cache, v_cache, metadata, scale=0.125))
    assert close(outputs[0], outputs[1])


# --- the engine's setting -----------------------------------------------------------------


@pytest.mark.parametrize("setting", ["auto", "native", "pytorch"])
def test_the_prefill_attention_setting_picks_the_runners_path(tiny_model_dir, setting, dtype):
    from inference.engine import EngineConfig, ModelRunner

    runs = paged_prefill_kernel.is_supported(dtype, CPU, 9, 3, 64)
    expected = {
        "auto": runs and paged_prefill_kernel.is_preferred(dtype),
        "native": runs,
        "pytorch": False,
    }[setting]
    config = EngineConfig(
        tiny_model_dir("qwen3"),
        dtype=dtype,
        kv_cache_mb=1,
        max_model_len=64,
        prefill_attention=setting,
    )
    runner = ModelRunner(config)
    assert runner.uses_prefill_kernel == expected
    # int8 KV caches are not the kernel's: PyTorch's path whatever the setting
    int8_cache = ModelRunner(dataclasses.replace(config, kv_cache_dtype="int8"))
    assert not int8_cache.uses_prefill_kernel


# --- the real model ------------------------------------------------------------------------


@pytest.mark.real_weights
@pytest.mark.usefixtures("torch_threads_on_free_cores")
def test_real_model_prefill_through_the_kernel_is_as_accurate_as_the_gather_path(
    chat_model_dir, real_tokenizer, dtype
):
    # Teacher-forced prefill of English text in chunks of 128 after a 256-token prefix: the
    # kernel's next-token perplexity must equal the PyTorch path's to the dtype's noise and its
    # top-1 predictions must agree.
    require_kernel(dtype)
    text = (Path(__file__).parents[2] / "data" / "squad_passages.txt").read_text()
    token_ids = real_tokenizer(text)["input_ids"][:768]
    runner = dtype_runner(chat_model_dir, dtype, kv_cache_mb=128, max_model_len=1024)
    assert runner.uses_prefill_kernel == paged_prefill_kernel.is_preferred(dtype)
    table = list(range(math.ceil(len(token_ids) / runner.block_size)))

    def prefill(uses_kernel: bool) -> tuple[torch.Tensor, torch.Tensor]:
        runner.uses_prefill_kernel = uses_kernel
        runner.execute([BatchEntry(token_ids[:256], 0, table)])
        logits = []
        for start in range(256, len(token_ids) - 1, 128):
            chunk = token_ids[start : start + 128]
            logits.append(runner.execute([BatchEntry(chunk, start, table, num_logits=len(chunk))]))
        logits = torch.cat(logits)[: len(token_ids) - 257]
        targets = torch.tensor(token_ids[257:])
        loss = torch.nn.functional.cross_entropy(logits, targets)
        return loss.exp(), logits.argmax(-1)

    kernel_perplexity, kernel_predictions = prefill(True)
    torch_perplexity, torch_predictions = prefill(False)
    assert abs(kernel_perplexity / torch_perplexity - 1) < 0.01
    assert (kernel_predictions == torch_predictions).float().mean() >= 0.95
