"""The native int4 matmul (csrc/int4_linear.c) and its weight layout, against the dequantized
weights multiplied in float32."""

from __future__ import annotations

import pytest
import torch

from inference.engine.kernels import int4_linear
from inference.engine.kernels.int4_linear import (
    MAX_TOKENS,
    pack_int4_vnni,
    quantize_int4_vnni,
    unpack_int4_vnni,
    unpack_int4_vnni_rows,
)
from inference.engine.layers.int8_gemm import Int8GemmWeight
from inference.engine.layers.quantization import Int4Linear
from tests.engine.kernels.conftest import assert_each_row_is_computed_alone

needs_kernel = pytest.mark.skipif(
    not int4_linear.is_supported(64, 32),
    reason="this CPU or machine cannot run the native int4 kernel",
)


def int4_layer(
    out_features: int,
    in_features: int,
    group_size: int,
    bias: bool = False,
    dtype: torch.dtype = torch.bfloat16,
) -> Int4Linear:
    generator = torch.Generator().manual_seed(out_features * 7 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    bias_tensor = torch.randn(out_features, generator=generator) if bias else None
    return Int4Linear(
        weight.to(dtype), None if bias_tensor is None else bias_tensor.to(dtype), group_size
    )


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize("num_cols", [32, 576, 1536])
def test_packing_round_trips_the_codes_and_single_rows_unpack(num_cols):
    codes = torch.randint(0, 16, (192, num_cols), dtype=torch.uint8)
    packed = pack_int4_vnni(codes)
    assert packed.shape == (192, num_cols // 2)
    assert torch.equal(unpack_int4_vnni(packed), codes)
    row_ids = torch.tensor([0, 15, 16, 63, 64, 130, 191])
    assert torch.equal(unpack_int4_vnni_rows(packed, row_ids), codes[row_ids])


def test_one_packed_vector_holds_8_columns_of_16_rows_in_nibbles():
    codes = torch.zeros(64, 16, dtype=torch.uint8)
    codes[0, :8] = torch.arange(1, 9, dtype=torch.uint8)
    codes[17, 8] = 15
    packed = pack_int4_vnni(codes).flatten()
    # row 0, step 0: bytes b = column b (low nibble) | column 4 + b (high nibble)
    assert packed[:4].tolist() == [1 | 5 << 4, 2 | 6 << 4, 3 | 7 << 4, 4 | 8 << 4]
    # step 1 starts after 64 rows x 4 bytes; row 17 is its 18th 4-byte slot
    assert packed[256 + 17 * 4].item() == 15


@needs_kernel
@pytest.mark.parametrize(
    ("out_features", "in_features", "group_size", "num_tokens"),
    [(192, 256, 32, 1), (100, 576, 64, 3), (3072, 576, 32, 2), (576, 1536, 128, 5),
     (64, 32, 32, MAX_TOKENS)],
)  # fmt: skip
def test_the_kernel_matches_the_dequantized_weights_to_bf16_rounding(
    out_features, in_features, group_size, num_tokens, isa_level, dtype
):
    layer = int4_layer(out_features, in_features, group_size, dtype=dtype)
    assert layer.is_native
    x = torch.randn(num_tokens, in_features, generator=torch.Generator().manual_seed(1))
    x[:, 5] = 40.0  # an outlier activation shares its block with small values
    x = x.to(dtype)
    expected = layer.dequantized_matmul(x.float())
    y = layer.kernel_matmul(x)
    assert y.dtype == dtype
    assert y.shape == (num_tokens, out_features)
    # bf16 output rounding alone is ~1.7e-3 here; one int8 code per activation measured ~8e-3;
    # float32 outputs keep only the activations' two int8 codes' error
    assert relative_error(y, expected) < (2.5e-3 if dtype == torch.bfloat16 else 5e-4)


@needs_kernel
@pytest.mark.parametrize("num_tokens", [2, 4, 7, 9])
def test_tokens_of_one_step_get_the_outputs_they_get_alone(num_tokens, isa_level, dtype):
    layer = int4_layer(192, 576, 64, dtype=dtype)
    x = torch.randn(num_tokens, 576, generator=torch.Generator().manual_seed(2)).to(dtype)
    assert_each_row_is_computed_alone(layer, x)


@needs_kernel
@pytest.mark.parametrize(
    ("out_features", "in_features", "group_size", "start", "end"),
    [(192, 256, 32, 0, 192), (300, 576, 64, 64, 300), (3072, 1536, 128, 1024, 1100)],
)
def test_native_dequantization_gives_pytorchs_values_transposed(
    out_features, in_features, group_size, start, end, isa_level, dtype
):
    layer = int4_layer(out_features, in_features, group_size, dtype=dtype)
    weight_t = layer.dequantize_rows_transposed(start, end, dtype)
    assert weight_t.is_contiguous()  # the kernel's, not a view of PyTorch's rows
    assert torch.equal(weight_t, layer.dequantize_rows(start, end, dtype).T)


@needs_kernel
@pytest.mark.parametrize(
    ("out_features", "in_features", "group_size"), [(192, 256, 32), (300, 576, 64), (100, 64, 64)]
)
def test_native_int8_gemm_codes_are_pytorchs_codes_of_the_float32_rows(
    out_features, in_features, group_size, isa_level, dtype
):
    """Codes made natively for a step are the codes kept (Int8GemmWeight.from_rows), bit for
    bit, whatever the rows' width and group size."""
    layer = int4_layer(out_features, in_features, group_size, dtype=dtype)
    assert layer.makes_int8_codes_natively
    codes_t, scales = int4_linear.int8_codes_transposed(
        layer.weight_int4, layer.scales, layer.zero_points, group_size, 0, out_features, dtype
    )
    expected = Int8GemmWeight.from_rows(layer.dequantize_rows(0, out_features, torch.float32))
    assert codes_t.shape == (in_features, out_features) and codes_t.is_contiguous()
    assert torch.equal(codes_t.t(), expected.codes) and torch.equal(scales, expected.scales)
    assert codes_t.abs().amax(dim=0).eq(127).all()  # each row's largest weight at full scale


@needs_kernel
def test_native_int8_gemm_codes_refuse_rows_outside_the_layout(dtype):
    layer = int4_layer(192, 256, 32, dtype=dtype)
    with pytest.raises(RuntimeError, match=r"int4_int8_codes refused rows \[32, 96\)"):
        int4_linear.int8_codes_transposed(
            layer.weight_int4, layer.scales, layer.zero_points, 32, 32, 96, dtype
        )


@needs_kernel
@pytest.mark.parametrize(("start", "end"), [(32, 96), (0, 256), (-64, 0)])
def test_native_dequantization_refuses_rows_outside_the_layout(start, end, dtype):
    layer = int4_layer(192, 256, 32, dtype=dtype)
    with pytest.raises(RuntimeError, match=rf"int4_dequantize refused rows \[{start}, {end}\)"):
        int4_linear.dequantize_transposed(
            layer.weight_int4, layer.scales, layer.zero_points, 32, start, end, dtype
        )


@needs_kernel
def test_the_layer_adds_its_bias_and_falls_back_above_the_kernels_token_limit(isa_level, dtype):
    layer = int4_layer(128, 64, 32, bias=True, dtype=dtype)
    for num_tokens in (1, MAX_TOKENS + 1):
        x = torch.randn(num_tokens, 64).to(dtype)
        expected = layer.dequantized_matmul(x.float()) + layer.bias.float()
        assert relative_error(layer(x), expected) < 1e-2


@needs_kernel
def test_a_wrong_input_width_is_refused_before_the_kernel_reads():
    layer = int4_layer(64, 64, 32)
    with pytest.raises(ValueError, match="input of 32 features in torch.bfloat16 for an int4"):
        layer._native_matmul(torch.randn(1, 32).bfloat16())
    with pytest.raises(ValueError, match="serving torch.bfloat16"):
        layer._native_matmul(torch.randn(1, 64))


def test_quantization_fits_at_least_as_well_as_plain_min_max_groups():
    generator = torch.Generator().manual_seed(3)
    groups = torch.randn(128, 6, 32, generator=generator) * 0.05
    groups[0, 0] = torch.linspace(0.01, 0.2, 32)  # one-signed groups: widened to reach 0
    groups[1, 0] = -torch.linspace(0.01, 0.2, 32)
    codes, scales, zero_points = quantize_int4_vnni(groups)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert scales.shape == zero_points.shape == (6, 128)
    assert scales.dtype == torch.bfloat16 and zero_points.dtype == torch.uint8
    step = scales.T.float()[..., None]  # [rows, groups, 1]
    restored = step * (codes.float() - zero_points.T.float()[..., None] / 16)
    # min/max groups with float32 scale and zero, no grid: what the fit must not lose to
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    plain_step = (high - low) / 15
    plain = torch.round((groups - low) / plain_step) * plain_step + low
    fitted_error = (restored - groups).pow(2).mean()
    assert fitted_error <= 1.05 * (plain - groups).pow(2).mean()
    assert ((restored - groups)[:2, 0].abs() <= step[:2, 0]).all()


@needs_kernel
def test_rows_looked_up_by_id_are_the_dequantized_rows():
    layer = int4_layer(128, 96, 32)
    assert layer.is_native
    ids = torch.tensor([[3, 64], [127, 0]])
    assert torch.equal(
        layer.dequantize_row_ids(ids, torch.bfloat16),
        layer.dequantize_rows(0, 128, torch.bfloat16)[ids],
    )


@needs_kernel
def test_the_native_format_takes_three_quarters_of_the_bytes_of_pytorchs_per_group(monkeypatch):
    native = int4_layer(128, 96, 32)
    monkeypatch.setattr(int4_linear, "is_supported", lambda *args: False)
    portable = int4_layer(128, 96, 32)
    assert not portable.is_native
    native_bytes = native.scales.nbytes + native.zero_points.nbytes
    assert native_bytes * 4 == portable.scales_and_zeros.nbytes * 3
    assert native.weight_int4.nbytes == portable.weight_int4.nbytes
    # the zero point's grid costs (almost) nothing against the 4-bit rounding itself
    generator = torch.Generator().manual_seed(128 * 7 + 96)
    weights = (torch.randn(128, 96, generator=generator) * 0.05).bfloat16().float()
    native_error = relative_error(native.dequantize_rows(0, 128, torch.float32), weights)
    portable_error = relative_error(portable.dequantize_rows(0, 128, torch.float32), weights)
    assert native_error < 1.05 * portable_error < 0.1


def test_float16_layers_and_unaligned_widths_keep_pytorchs_layout():
    weight = torch.randn(64, 64) * 0.05
    assert not Int4Linear(weight.half(), None, 32).is_native
    assert not int4_linear.is_supported(48, 32)
    assert not int4_linear.is_supported(64, 48)
