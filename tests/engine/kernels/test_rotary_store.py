"""Native rotary embedding + KV-cache write against the PyTorch ops (bitwise, bf16 and float32,
at every instruction set level the CPU has)."""

from __future__ import annotations

import pytest
import torch

from inference.engine import BatchEntry, EngineConfig, ModelRunner
from inference.engine.kernels import rotary_store as native_rotary
from inference.engine.layers.attention import build_attention_metadata
from inference.engine.layers.rotary import RopeArgs, RotaryEmbedding, apply_rotary

needs_kernel = pytest.mark.skipif(
    not native_rotary.is_supported(
        torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.bfloat16), 64
    ),
    reason="the native kernel needs a CPU with AVX2, AVX-512 or NEON and a C compiler",
)


@needs_kernel
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 128)])
@pytest.mark.parametrize("query_lens", [[1], [1, 1, 1], [40], [1, 1, 37]])
def test_rotation_and_cache_write_are_bitwise_the_pytorch_ops(
    num_heads, num_kv_heads, head_dim, query_lens, isa_level, dtype
):
    generator = torch.Generator().manual_seed(len(query_lens))
    num_tokens = sum(query_lens)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = (torch.randn(num_tokens, width, generator=generator) * 2).to(dtype)
    computed = [5 + 20 * i for i in range(len(query_lens))]
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(len(query_lens))]
    metadata = build_attention_metadata(
        query_lens, computed, tables, block_size=16, num_kv_heads=num_kv_heads
    )
    cos, sin = RotaryEmbedding(RopeArgs(theta=10000.0), head_dim)(metadata.positions, dtype)
    shape = (8 * len(query_lens), num_kv_heads, 16, head_dim)
    k_cache, v_cache = (
        torch.zeros(shape, dtype=dtype),
        torch.zeros(shape, dtype=dtype),
    )
    q, k = native_rotary.rotate_and_store(
        qkv, cos, sin, k_cache, v_cache, metadata.write_index, num_heads, num_kv_heads, head_dim
    )

    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qk = apply_rotary(qkv[:, : q_size + kv_size].view(num_tokens, -1, head_dim), cos, sin)
    expected_k = qk[:, num_heads:]
    expected_v = qkv[:, q_size + kv_size :].reshape(-1, head_dim)
    assert torch.equal(q, qk[:, :num_heads]) and torch.equal(k, expected_k)
    expected_k_cache, expected_v_cache = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    expected_k_cache.view(-1, head_dim).index_copy_(
        0, metadata.write_index, expected_k.reshape(-1, head_dim)
    )
    expected_v_cache.view(-1, head_dim).index_copy_(0, metadata.write_index, expected_v)
    assert torch.equal(k_cache, expected_k_cache) and torch.equal(v_cache, expected_v_cache)


def test_other_dtypes_and_head_sizes_are_left_to_pytorch():
    bf16, fp32 = torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1)
    fp16 = torch.zeros(1, dtype=torch.float16)
    assert not native_rotary.is_supported(fp16, fp16, 64)
    assert not native_rotary.is_supported(fp32, bf16, 64)
    assert not native_rotary.is_supported(bf16, torch.zeros(1, dtype=torch.int8), 64)
    assert not native_rotary.is_supported(bf16, bf16, 48)


@needs_kernel
@pytest.mark.usefixtures("torch_threads_on_free_cores")
def test_a_bf16_model_computes_bitwise_the_same_logits_with_the_native_rotation(
    tiny_model_dir, monkeypatch
):
    config = EngineConfig(
        tiny_model_dir("llama"),  # head_dim 32: the kernel's smallest
        dtype=torch.bfloat16,
        kv_cache_mb=1,
        block_size=16,
        max_model_len=64,
    )
    runner = ModelRunner(config)
    assert runner.model.args.head_dim == 32

    def logits() -> torch.Tensor:
        prompt = list(range(3, 40))
        prefill = runner.execute([BatchEntry(prompt, 0, [0, 1, 2])])
        decode = runner.execute([BatchEntry([7], len(prompt), [0, 1, 2])])
        return torch.cat([prefill, decode])

    native = logits()
    monkeypatch.setattr(native_rotary, "is_supported", lambda *args: False)
    assert torch.equal(native, logits())
