"""The integer GEMM's native coding, scaling, column-peak and finishing passes
(csrc/int8_gemm.c) against the PyTorch ops they replace (layers/int8_gemm.py), bit for bit where
they do the same float32 operations, at every instruction set level the CPU has and for both
activation types."""

from __future__ import annotations

import pytest
import torch

from inference.engine.kernels import int8_gemm
from inference.engine.layers.int8_gemm import OUTLIER_RATIO, _code_tokens, outlier_columns

needs_kernel = pytest.mark.skipif(
    not int8_gemm.is_supported(torch.zeros(1, 16), 16),
    reason="the native kernels need a CPU with AVX2, AVX-512 or NEON and a C compiler",
)


def activations(num_tokens: int, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(num_tokens * 31 + in_features)
    x = torch.randn(num_tokens, in_features, generator=generator)
    x[:, 5] *= 40  # an outlier column
    if num_tokens > 1:
        x[1] = 0  # a token of zeros: the smallest scale, codes 0
    return x.to(dtype)


@needs_kernel
@pytest.mark.parametrize(("num_tokens", "in_features"), [(1, 16), (7, 576), (130, 1536)])
@pytest.mark.parametrize("with_outliers", [True, False])
def test_native_codes_and_scales_are_pytorchs(
    num_tokens, in_features, with_outliers, isa_level, dtype
) -> None:
    x = activations(num_tokens, in_features, dtype)
    outliers = torch.tensor([5, in_features - 1] if with_outliers else [], dtype=torch.int64)
    skip = torch.zeros(in_features, dtype=torch.uint8)
    skip[outliers] = 1
    codes, scales = int8_gemm.code_tokens(x, skip)
    expected_codes, expected_scales = _code_tokens(x, x.abs(), outliers)
    assert torch.equal(codes, expected_codes) and torch.equal(scales, expected_scales)
    if with_outliers:
        assert not codes[:, outliers].any()
    assert codes.abs().amax() == 127


@needs_kernel
@pytest.mark.parametrize(("num_tokens", "out_features"), [(1, 16), (9, 960), (128, 2048)])
def test_native_scaled_sums_are_pytorchs(num_tokens, out_features, isa_level, dtype) -> None:
    generator = torch.Generator().manual_seed(num_tokens + out_features)
    sums = torch.randint(-(2**20), 2**20, (num_tokens, out_features), generator=generator)
    sums = sums.to(torch.int32)
    token_scales = torch.rand(num_tokens, 1, generator=generator) / 127
    row_scales = torch.rand(out_features, generator=generator) / 127
    y = int8_gemm.scale_sums(sums, token_scales, row_scales, dtype)
    expected = sums.float().mul_(token_scales).mul_(row_scales).to(dtype)
    assert torch.equal(y, expected)
    # into a block of rows of a larger result, leaving the rest as it was
    result = torch.full((num_tokens + 2, out_features), 7.0, dtype=dtype)
    written = int8_gemm.scale_sums(sums, token_scales, row_scales, dtype, out=result[1:-1])
    assert written.data_ptr() == result[1].data_ptr() and torch.equal(result[1:-1], expected)
    assert (result[0] == 7).all() and (result[-1] == 7).all()


def pytorch_outliers(x: torch.Tensor, max_outliers: int) -> torch.Tensor:
    """layers/int8_gemm.py's choice of outlier columns in PyTorch ops, ascending."""
    return outlier_columns(x.abs().amax(dim=0), max_outliers).sort().values


@needs_kernel
@pytest.mark.parametrize(
    ("num_tokens", "in_features", "num_large", "max_outliers"),
    [(1, 16, 0, 0), (7, 576, 2, 18), (37, 1536, 40, 48), (130, 8960, 900, 280)],
)
def test_native_outliers_codes_and_outlier_values_are_pytorchs(
    num_tokens, in_features, num_large, max_outliers, isa_level, dtype
) -> None:
    """The columns picked (past the cap: the largest), the tokens coded without them, and their
    values: what layers/int8_gemm.py's PyTorch path computes, bit for bit."""
    generator = torch.Generator().manual_seed(num_tokens + in_features)
    x = torch.randn(num_tokens, in_features, generator=generator)
    # large columns of distinct sizes (no ties at the cap), some of them past the threshold
    x[:, :num_large] *= torch.rand(num_large, generator=generator) * 20 + 1
    x = x.to(dtype)
    codes, scales, outliers, values = int8_gemm.code_tokens_outliers(x, OUTLIER_RATIO, max_outliers)
    expected = pytorch_outliers(x, max_outliers)
    assert torch.equal(outliers, expected)
    assert 0 < outliers.numel() <= max_outliers or max_outliers == 0 or num_large == 0
    expected_codes, expected_scales = _code_tokens(x, x.abs(), expected)
    assert torch.equal(codes, expected_codes) and torch.equal(scales, expected_scales)
    # as uint8 codes + 128 (oneDNN's VNNI GEMM): the same scales, each code shifted
    unsigned_codes, unsigned_scales, _, _ = int8_gemm.code_tokens_outliers(
        x, OUTLIER_RATIO, max_outliers, unsigned=True
    )
    assert unsigned_codes.dtype == torch.uint8 and torch.equal(unsigned_scales, scales)
    assert torch.equal(unsigned_codes.long() - 128, codes.long())
    assert values.shape == (num_tokens, outliers.numel()) and values.is_contiguous()
    assert torch.equal(values, x[:, outliers].float())


@needs_kernel
def test_the_outlier_cap_keeps_the_largest_columns(dtype) -> None:
    x = torch.ones(4, 64)
    x[:, 10], x[:, 20], x[:, 30] = 50.0, 90.0, 70.0  # three past 6x the median, room for two
    _, _, outliers, values = int8_gemm.code_tokens_outliers(x.to(dtype), 6.0, 2)
    assert outliers.tolist() == [20, 30] and values[0].tolist() == [90.0, 70.0]


@needs_kernel
@pytest.mark.parametrize(
    ("num_tokens", "out_features", "num_outliers"), [(1, 16, 0), (6, 272, 3), (33, 1040, 37)]
)
def test_finished_rows_are_the_token_scaled_rows_plus_the_outlier_product(
    num_tokens, out_features, num_outliers, isa_level, dtype
) -> None:
    """Row blocks of 4 with a partial last one, column chunks of 256 with a partial last one;
    the outlier product's float32 sums in another order than PyTorch's matmul, so compared
    within float32 rounding before the one rounding to the activation type."""
    generator = torch.Generator().manual_seed(num_tokens + out_features)
    in_features = 96
    y = torch.randn(num_tokens, out_features, generator=generator).to(dtype)
    token_scales = torch.rand(num_tokens, 1, generator=generator) / 127
    codes_t = torch.randint(-127, 128, (in_features, out_features), generator=generator)
    codes_t = codes_t.to(torch.int8)
    row_scales = torch.rand(out_features, generator=generator) / 127
    outlier_ids = torch.randperm(in_features, generator=generator)[:num_outliers]
    outlier_x = torch.randn(num_tokens, num_outliers, generator=generator) * 30
    expected = y.float() * token_scales + (outlier_x @ codes_t[outlier_ids].float()) * row_scales
    finished = int8_gemm.finish_rows(
        y.clone(), token_scales, outlier_x, outlier_ids, codes_t, row_scales
    )
    assert finished.dtype == dtype
    # one rounding to bf16: half a step of 8 bits, of the largest value at most
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 2**-8}[dtype]
    error = (finished.float() - expected).abs().max()
    assert float(error) <= tolerance * float(expected.abs().max())
    # into a block of rows of a larger result, leaving y and the rest as they were
    result = torch.full((num_tokens + 2, out_features), 7.0, dtype=dtype)
    kept = y.clone()
    written = int8_gemm.finish_rows(
        y, token_scales, outlier_x, outlier_ids, codes_t, row_scales, out=result[1:-1]
    )
    assert written.data_ptr() == result[1].data_ptr() and torch.equal(result[1:-1], finished)
    assert torch.equal(y, kept) and (result[0] == 7).all() and (result[-1] == 7).all()


@needs_kernel
def test_scaled_sums_refuse_an_out_of_another_shape_dtype_or_layout(dtype) -> None:
    sums = torch.zeros(4, 32, dtype=torch.int32)
    scales = (torch.ones(4, 1), torch.ones(32))
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    for out in (
        torch.empty(4, 16, dtype=dtype),
        torch.empty(4, 32, dtype=other),
        torch.empty(32, 4, dtype=dtype).t(),
    ):
        with pytest.raises(ValueError, match="out must be a contiguous"):
            int8_gemm.scale_sums(sums, *scales, dtype, out=out)


@needs_kernel
def test_widths_that_are_not_a_multiple_of_16_are_refused(dtype) -> None:
    assert not int8_gemm.is_supported(torch.zeros(2, 24, dtype=dtype), 16)
    assert not int8_gemm.is_supported(torch.zeros(2, 16, dtype=dtype), 40)
    with pytest.raises(ValueError, match="not a multiple of 16"):
        int8_gemm.code_tokens(torch.zeros(2, 24, dtype=dtype), torch.zeros(24, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not a multiple of 16"):
        int8_gemm.code_tokens_outliers(torch.zeros(2, 24, dtype=dtype), 6.0, 1)
