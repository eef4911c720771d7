"""Dense GEMM weights: oneDNN-packed bf16 copies where oneDNN runs bf16, strided W^T elsewhere."""

from __future__ import annotations

import pytest
import torch

from inference.engine.layers.dense_gemm import DenseGemmWeight, packed_linear_available

needs_packing = pytest.mark.skipif(
    not packed_linear_available(torch.bfloat16), reason="oneDNN runs no bf16 linear on this CPU"
)


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@needs_packing
@pytest.mark.parametrize("num_tokens", [1, 9, 32, 300])
def test_a_packed_bf16_copy_multiplies_like_the_strided_one(generator, num_tokens) -> None:
    weight_t = torch.randn(192, 320, generator=generator).bfloat16()
    x = torch.randn(num_tokens, 192, generator=generator).bfloat16()
    dense = DenseGemmWeight.from_transposed(weight_t)
    assert dense.is_packed and dense.weight.is_mkldnn
    y = dense.matmul(x)
    assert y.dtype == torch.bfloat16 and y.shape == (num_tokens, 320)
    torch.testing.assert_close(y, torch.matmul(x, weight_t), rtol=1.6e-2, atol=5e-2)
    assert (dense.in_features, dense.out_features, dense.dtype) == (192, 320, torch.bfloat16)
    assert dense.nbytes == 192 * 320 * 2


def test_a_float32_copy_stays_strided_and_exact(generator) -> None:
    weight_t = torch.randn(64, 96, generator=generator)
    x = torch.randn(5, 64, generator=generator)
    dense = DenseGemmWeight.from_transposed(weight_t)
    assert not dense.is_packed and dense.weight is weight_t
    torch.testing.assert_close(dense.matmul(x), x @ weight_t, rtol=0, atol=0)
    assert dense.nbytes == 64 * 96 * 4


def test_only_bf16_is_packed() -> None:
    assert not packed_linear_available(torch.float32)
    assert not packed_linear_available(torch.float16)
