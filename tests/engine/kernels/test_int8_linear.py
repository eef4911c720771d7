"""The native int8 matmul (csrc/int8_linear.c) and its weight layout, against the dequantized
weights multiplied in float32, bf16 and float32, at every instruction set level the CPU has."""

from __future__ import annotations

import pytest
import torch

from inference.engine.kernels import int8_linear
from inference.engine.kernels.int8_linear import (
    MAX_TOKENS,
    pack_int8,
    unpack_int8_row_ids,
    unpack_int8_rows,
)
from inference.engine.layers.int8_gemm import Int8GemmWeight
from inference.engine.layers.quantization import Int8Linear, quantize_rows_int8
from tests.engine.kernels.conftest import assert_each_row_is_computed_alone

needs_kernel = pytest.mark.skipif(
    not int8_linear.is_supported(64),
    reason="the native int8 kernel needs a CPU with AVX2, AVX-512 or NEON and a C compiler",
)


def int8_layer(
    out_features: int, in_features: int, *, bias: bool = False, dtype: torch.dtype
) -> Int8Linear:
    generator = torch.Generator().manual_seed(out_features * 7 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    weight[:, 3] = 0.4  # a column of outliers: rows span the whole int8 range
    bias_tensor = torch.randn(out_features, generator=generator).to(dtype) if bias else None
    return Int8Linear(weight.to(dtype), bias_tensor)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected).norm() / expected.norm()).item()


def test_packing_keeps_every_code_and_rows_unpack_from_any_offset():
    codes = torch.randint(-127, 128, (150, 96), dtype=torch.int8)
    packed = pack_int8(codes)
    assert packed.shape == (192, 96)  # padded to whole tiles of 64 rows, with zeros
    assert torch.equal(unpack_int8_rows(packed, 0, 150), codes)
    assert torch.equal(unpack_int8_rows(packed, 70, 131), codes[70:131])
    assert not unpack_int8_rows(packed, 150, 192).any()
    ids = torch.tensor([0, 63, 64, 149, 5])
    assert torch.equal(unpack_int8_row_ids(packed, ids), codes[ids])


def test_one_packed_vector_holds_4_columns_of_16_rows():
    codes = torch.zeros(64, 8, dtype=torch.int8)
    codes[0, :4] = torch.tensor([1, 2, 3, 4], dtype=torch.int8)
    codes[17, 5] = -9
    packed = pack_int8(codes).flatten()
    assert packed[:4].tolist() == [1, 2, 3, 4]  # row 0, columns 0-3
    assert packed[256 + 17 * 4 + 1].item() == -9  # step 1 (columns 4-7) after 64 x 4 bytes


@needs_kernel
@pytest.mark.parametrize(
    ("out_features", "in_features", "num_tokens"),
    [(192, 256, 1), (100, 576, 3), (1536, 4864, 2), (64, 32, MAX_TOKENS)],
)
def test_the_kernel_matches_the_dequantized_weights(
    out_features, in_features, num_tokens, isa_level, dtype
):
    layer = int8_layer(out_features, in_features, dtype=dtype)
    assert layer.is_native
    x = torch.randn(num_tokens, in_features, generator=torch.Generator().manual_seed(1))
    x[:, 5] = 40.0  # an outlier activation shares its block with small values
    x = x.to(dtype)
    expected = layer.dequantize_rows(0, out_features, torch.float32) @ x.float().T
    y = layer.kernel_matmul(x)
    assert y.dtype == dtype and y.shape == (num_tokens, out_features)
    # bf16: its output rounding (~1.5e-3); float32: the activations' two int8 codes only
    assert relative_error(y, expected.T) < (2.5e-3 if dtype == torch.bfloat16 else 2e-4)


@needs_kernel
@pytest.mark.parametrize("num_tokens", [2, 4, 7, 9])
def test_tokens_of_one_step_get_the_outputs_they_get_alone(num_tokens, isa_level, dtype):
    layer = int8_layer(192, 576, dtype=dtype)
    x = torch.randn(num_tokens, 576, generator=torch.Generator().manual_seed(2)).to(dtype)
    assert_each_row_is_computed_alone(layer, x)


@needs_kernel
@pytest.mark.parametrize(
    ("out_features", "in_features", "start", "end"),
    [(192, 256, 0, 192), (300, 576, 64, 300), (3072, 1536, 1024, 1100)],
)
def test_native_dequantization_gives_pytorchs_values_transposed(
    out_features, in_features, start, end, isa_level, dtype
):
    layer = int8_layer(out_features, in_features, dtype=dtype)
    weight_t = layer.dequantize_rows_transposed(start, end, dtype)
    assert weight_t.is_contiguous()  # the kernel's, not a view of PyTorch's rows
    assert torch.equal(weight_t, layer.dequantize_rows(start, end, dtype).T)


@needs_kernel
@pytest.mark.parametrize(("out_features", "in_features"), [(192, 256), (300, 576), (64, 32)])
def test_native_int8_gemm_codes_are_pytorchs_codes_of_the_float32_rows(
    out_features, in_features, isa_level, dtype
):
    """Codes made natively for a step are the codes kept (Int8GemmWeight.from_rows), bit for
    bit, whatever the rows' width; a row of zeros codes to zeros with the smallest scale."""
    layer = int8_layer(out_features, in_features, dtype=dtype)
    layer.weight_int8[:64].zero_()  # NOTE: the first tile's rows all 0 (padding rows are)
    assert layer.makes_int8_codes_natively
    codes_t, scales = int8_linear.int8_codes_transposed(
        layer.weight_int8, layer.scales, 0, out_features, dtype
    )
    expected = Int8GemmWeight.from_rows(layer.dequantize_rows(0, out_features, torch.float32))
    assert codes_t.shape == (in_features, out_features) and codes_t.is_contiguous()
    assert torch.equal(codes_t.t(), expected.codes) and torch.equal(scales, expected.scales)
    assert not codes_t[:, :64].any() and codes_t[:, 64:].abs().amax(dim=0).eq(127).all()


@needs_kernel
@pytest.mark.parametrize(("start", "end"), [(32, 96), (0, 256), (-64, 0)])
def test_native_dequantization_refuses_rows_outside_the_layout(start, end, dtype):
    layer = int8_layer(192, 256, dtype=dtype)
    with pytest.raises(RuntimeError, match=rf"int8_dequantize refused rows \[{start}, {end}\)"):
        int8_linear.dequantize_transposed(layer.weight_int8, layer.scales, start, end, dtype)


@needs_kernel
def test_the_layer_adds_its_bias_and_falls_back_above_the_kernels_token_limit(isa_level, dtype):
    layer = int8_layer(128, 64, bias=True, dtype=dtype)
    weights = layer.dequantize_rows(0, 128, torch.float32)
    for num_tokens in (1, MAX_TOKENS + 1):
        x = torch.randn(num_tokens, 64).to(dtype)
        expected = x.float() @ weights.T + layer.bias.float()
        assert relative_error(layer(x), expected) < 1e-2


@needs_kernel
def test_native_and_pytorch_layouts_hold_the_same_weights_and_look_up_the_same_rows():
    weight = torch.randn(100, 64) * 0.05
    native = Int8Linear(weight, None)
    portable = Int8Linear(weight, None, native_kernels=False)
    assert native.is_native and not portable.is_native
    assert portable.weight_int8.shape == (100, 64) and native.weight_int8.shape == (128, 64)
    assert torch.equal(
        native.dequantize_rows(0, 100, torch.float32),
        portable.dequantize_rows(0, 100, torch.float32),
    )
    ids = torch.tensor([[3, 64], [99, 0]])
    assert torch.equal(
        native.dequantize_row_ids(ids, torch.float32),
        portable.dequantize_row_ids(ids, torch.float32),
    )


@needs_kernel
def test_rows_quantized_a_chunk_at_a_time_load_natively():
    weight = torch.randn(70, 96) * 0.05
    codes, scales = quantize_rows_int8(weight, torch.bfloat16)
    layer = Int8Linear.from_codes(codes, scales, None)
    assert layer.is_native and layer.dtype == torch.bfloat16
    whole = Int8Linear(weight, None, dtype=torch.bfloat16)
    assert torch.equal(
        layer.dequantize_rows(0, 70, torch.float32), whole.dequantize_rows(0, 70, torch.float32)
    )


@needs_kernel
def test_a_wrong_input_is_refused_before_the_kernel_reads():
    layer = int8_layer(64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="input of 32 features in torch.bfloat16 for an int8"):
        layer._native_matmul(torch.randn(1, 32).bfloat16())
    with pytest.raises(ValueError, match="serving torch.bfloat16"):
        layer._native_matmul(torch.randn(1, 64))


def test_float16_layers_and_unaligned_widths_keep_the_pytorch_layout():
    assert not Int8Linear(torch.randn(64, 64).half(), None).is_native
    assert not int8_linear.is_supported(48)
