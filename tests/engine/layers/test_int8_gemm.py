"""Int8 GEMM weights: per-row weight codes times per-token activation codes, outliers in float."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from inference.engine.kernels import has_amx
from inference.engine.layers.int8_gemm import (
    MAX_OUTLIER_SHARE,
    ROWS_PER_GEMM,
    Int8GemmWeight,
    packed_int8_gemm_available,
)

needs_packing = pytest.mark.skipif(
    not packed_int8_gemm_available(), reason="this PyTorch build has no oneDNN int8 linear"
)


def relative_error(y: torch.Tensor, expected: torch.Tensor) -> float:
    return float((y.float() - expected).norm() / expected.norm())


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_codes_reproduce_each_row_to_within_half_a_step(generator) -> None:
    weight = torch.randn(96, 64, generator=generator)
    codes = Int8GemmWeight.from_rows(weight)
    assert codes.codes.dtype == torch.int8 and codes.codes.shape == (96, 64)
    restored = codes.codes.float() * codes.scales[:, None]
    assert torch.all((restored - weight).abs() <= codes.scales[:, None] / 2 + 1e-7)
    assert int(codes.codes.abs().max()) == 127
    assert codes.nbytes == 96 * 64 + 96 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [48, ROWS_PER_GEMM * 2 + 3])
def test_a_product_matches_the_float_one_within_int8_rounding(generator, dtype, num_tokens) -> None:
    weight = torch.randn(256, 128, generator=generator)
    x = torch.randn(num_tokens, 128, generator=generator).to(dtype)
    y = Int8GemmWeight.from_rows(weight).matmul(x)
    assert y.dtype == dtype and y.shape == (num_tokens, 256)
    assert relative_error(y, x.float() @ weight.T) < 0.02


def test_outlier_columns_are_multiplied_in_float(generator) -> None:
    """One column far above the rest would flatten every other code of its tokens; taken out,
    the other columns' share of the product keeps its int8 precision."""
    weight = torch.randn(64, 512, generator=generator)
    x = torch.randn(24, 512, generator=generator)
    x[:, 7] = 200.0  # ~200x the other columns' typical magnitude
    gemm = Int8GemmWeight.from_rows(weight)
    expected = x @ weight.T
    others = x.index_fill(1, torch.tensor([7]), 0) @ weight.T

    def error_on_the_others(y: torch.Tensor) -> float:
        return float((y - expected).norm() / others.norm())

    # NOTE: what is left is the outlier column's own weight rounding, times its magnitude
    y = gemm.matmul(x)
    assert error_on_the_others(y) < 0.1
    # the same product coded per token with the outlier inside: what the decomposition avoids
    scales = x.abs().amax(1, keepdim=True) / 127
    naive = (torch.round(x / scales) * scales) @ (gemm.codes.float() * gemm.scales[:, None]).T
    assert error_on_the_others(naive) > 0.3


def test_at_most_a_share_of_the_columns_is_multiplied_in_float_the_largest(generator) -> None:
    """Columns far above the median column pass as outliers up to MAX_OUTLIER_SHARE of the inputs;
    past it the largest are taken, and the rest are coded with the others."""
    weight = torch.randn(32, 256, generator=generator)
    gemm = Int8GemmWeight.from_rows(weight)
    x = torch.randn(20, 256, generator=generator)
    max_outliers = int(MAX_OUTLIER_SHARE * 256)
    x[:, : 2 * max_outliers] = 50.0  # twice as many large columns as go through float
    x[:, 2 * max_outliers - 1] = 5000.0  # the largest, last: coded it would flatten every code
    expected = x @ weight.T
    y = gemm.matmul(x)
    assert float((y - expected).norm() / expected.norm()) < 0.02


def test_all_zero_activations_give_zero_sums(generator) -> None:
    gemm = Int8GemmWeight.from_rows(torch.randn(32, 64, generator=generator))
    x = torch.zeros(17, 64)
    assert torch.count_nonzero(gemm.matmul(x)) == 0


def test_a_step_of_no_tokens_gives_no_rows(generator) -> None:
    """As the dequantizing path does: an empty product, not a reduction over no tokens."""
    gemm = Int8GemmWeight.from_rows(torch.randn(32, 64, generator=generator))
    y = gemm.matmul(torch.empty(0, 64, dtype=torch.bfloat16))
    assert y.shape == (0, 32) and y.dtype == torch.bfloat16


def test_outlier_counts_between_powers_of_two_are_padded_without_adding_to_the_product(
    generator,
) -> None:
    """Three outlier columns go through a float product of eight (padded: oneDNN compiles a
    GEMM per shape); the padding repeats column 0, which must add nothing."""
    weight = torch.randn(64, 512, generator=generator)
    x = torch.randn(24, 512, generator=generator)
    x[:, [5, 9, 11]] = 200.0
    x[:, 0] = 4.0  # counted five more times, it would move the product by ~10%
    gemm = Int8GemmWeight.from_rows(weight)
    # the weight as its codes hold it: what is left is the other columns' activation codes
    coded_weight = gemm.codes.float() * gemm.scales[:, None]
    expected = x @ coded_weight.T
    others = x.index_fill(1, torch.tensor([5, 9, 11]), 0) @ coded_weight.T
    assert float((gemm.matmul(x) - expected).norm() / others.norm()) < 0.02


@needs_packing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 9, 32, ROWS_PER_GEMM * 2 + 3])
@pytest.mark.parametrize("in_features", [256, 72])  # 72: no native passes (not a multiple of 16)
@pytest.mark.parametrize("unsigned_activations", [False, True])
def test_packed_codes_multiply_as_the_plain_ones(
    generator, dtype, num_tokens, in_features, unsigned_activations
) -> None:
    """The same int32 sums (oneDNN's against torch._int_mm, the activations int8 or uint8
    codes + 128), scaled back; in bf16 rounded twice (row scales, then token scales) where the
    plain path rounds once."""
    weight = torch.randn(96, in_features, generator=generator)
    x = torch.randn(num_tokens, in_features, generator=generator)
    x[:, 3] = 90.0  # an outlier column: multiplied in float either way
    x = x.to(dtype)
    plain = Int8GemmWeight.from_rows(weight)
    packed = plain.packed_for_onednn(unsigned_activations=unsigned_activations)
    assert packed.packed is not None and plain.packed is None
    assert packed.unsigned_activations == unsigned_activations
    y = packed.matmul(x)
    assert y.dtype == dtype and y.shape == (num_tokens, 96)
    # float32: the same sums scaled in another order; bf16: a step of 8 bits of the largest
    # output at most (a value between two bf16 numbers may round either way)
    tolerance = 1e-6 if dtype == torch.float32 else 2**-7
    expected = plain.matmul(x).float()
    assert float((y.float() - expected).abs().max()) <= tolerance * float(expected.abs().max())
    assert relative_error(y, x.float() @ weight.T) < 0.02


@needs_packing
def test_packed_codes_keep_the_plain_ones_as_w_transposed_and_count_both(generator) -> None:
    """The plain codes serve the outlier columns' float product: rows of W^T, read in order."""
    plain = Int8GemmWeight.from_rows(torch.randn(48, 160, generator=generator))
    packed = plain.packed_for_onednn()
    assert packed.packed_for_onednn() is packed
    assert packed.codes.t().is_contiguous() and torch.equal(packed.codes, plain.codes)
    assert torch.equal(packed.scales, plain.scales)
    assert packed.nbytes == 2 * 48 * 160 + 48 * 4


@needs_packing
def test_packed_codes_take_unsigned_activations_where_the_cpu_has_no_amx(generator) -> None:
    """VNNI multiplies unsigned by signed bytes; oneDNN ran int8 activations on a reference path
    there (Zen 4: ~1,000x slower), while AMX's tiles take int8 by int8."""
    plain = Int8GemmWeight.from_rows(torch.randn(32, 64, generator=generator))
    assert plain.packed_for_onednn().unsigned_activations == (not has_amx())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weight_without_native_passes_gives_the_native_passes_results(generator, dtype) -> None:
    """An engine without native kernels runs PyTorch's ops alone: the same codes, outliers and
    scaling, so the same products bit for bit (csrc/int8_gemm.c does PyTorch's float32 ops)."""
    plain = Int8GemmWeight.from_rows(torch.randn(64, 256, generator=generator))
    x = torch.randn(40, 256, generator=generator)
    x[:, 9] = 70.0  # an outlier column
    x = x.to(dtype)
    without = replace(plain, native_passes=False)
    assert torch.equal(without.matmul(x), plain.matmul(x))
