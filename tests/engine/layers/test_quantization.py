"""Weight-only quantization (int8, int4) and the int8 KV cache: accuracy, kernels, wiring."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inference.engine import BatchEntry, EngineConfig, ModelRunner
from inference.engine.config import ConfigError
from inference.engine.kernels import int4_linear as native_int4
from inference.engine.kernels.int4_linear import unpack_int4_vnni
from inference.engine.kv_cache import KVCacheSpec, dequantize_kv, quantize_kv
from inference.engine.layers.quantization import (
    PACKED_KERNEL_MAX_TOKENS,
    Int4Linear,
    Int8Linear,
    QuantizedEmbedding,
    QuantizedLinear,
    _torch_int4_layout_matches,
    check_quantization,
    model_weight_bytes,
    pack_int4,
    quantize_linear,
    quantize_model,
    quantize_rows_int8,
    unpack_int4,
    weight_formats,
)
from inference.engine.loader import load_model

pytestmark = pytest.mark.usefixtures("torch_threads_on_free_cores")


def make_linear(out_features: int, in_features: int, dtype: torch.dtype) -> nn.Linear:
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features).to(dtype)
    with torch.no_grad():
        linear.weight.normal_(0, 0.05)
        linear.bias.normal_(0, 0.1)
    return linear


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("method", "bound"), [("int8", 0.01), ("int4", 0.1)])
def test_quantized_linear_stays_close_to_the_float_layer(method, bound, dtype):
    linear = make_linear(192, 256, dtype)
    quantized = quantize_linear(linear, method, 32)
    for num_tokens in (1, PACKED_KERNEL_MAX_TOKENS + 5):
        x = torch.randn(num_tokens, 256, dtype=dtype)
        expected = nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float())
        y = quantized(x)
        assert y.dtype == dtype
        assert y.shape == (num_tokens, 192)
        assert relative_error(y, expected) < bound


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_packed_kernel_and_plain_pytorch_fallback_agree(method, dtype):
    quantized = quantize_linear(make_linear(320, 128, dtype), method, 64)
    x = torch.randn(3, 128, dtype=dtype)
    assert quantized.can_use_kernel(x)
    kernel = quantized.kernel_matmul(x)
    fallback = quantized.dequantized_matmul(x)
    tolerance = 2e-2 if dtype is torch.bfloat16 else 1e-4
    assert relative_error(kernel, fallback) < tolerance


def test_int4_rows_that_are_not_a_multiple_of_64_are_padded_and_sliced_off():
    linear = make_linear(100, 64, torch.float32)
    quantized = quantize_linear(linear, "int4", 32)
    x = torch.randn(2, 64)
    assert quantized(x).shape == (2, 100)
    # NOTE: the native kernel quantizes the activations (two int8 codes per value): ~1e-4 off
    torch.testing.assert_close(
        quantized(x), quantized.dequantized_matmul(x) + linear.bias, atol=1e-3, rtol=1e-3
    )


@pytest.mark.parametrize("num_cols", [64, 576, 1536])
def test_int4_packing_unpacks_to_the_codes_and_is_used_only_where_it_is_torchs_layout(num_cols):
    codes = torch.randint(0, 16, (192, num_cols), dtype=torch.int32)
    packed = pack_int4(codes)
    assert torch.equal(unpack_int4(packed), codes.to(torch.uint8))
    # NOTE: torch's CPU int4 packing depends on the CPU it runs on (its AVX-512 build's layout
    # is pack_int4's; AVX2 CPUs get another): int4 layers use torch's kernel only where they match.
    is_torchs_layout = torch.equal(packed, torch._convert_weight_to_int4pack_for_cpu(codes, 1))
    assert _torch_int4_layout_matches() == is_torchs_layout


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_embedding_lookup_returns_the_dequantized_rows(method):
    table = quantize_linear(make_linear(256, 64, torch.bfloat16), method, 32)
    embedding = QuantizedEmbedding(table, torch.bfloat16)
    ids = torch.tensor([[0, 1, 31, 32], [63, 64, 200, 255]])
    rows = embedding(ids)
    assert rows.shape == (2, 4, 64)
    assert torch.equal(rows, table.dequantize_rows(0, 256, torch.bfloat16)[ids])


@pytest.mark.parametrize(
    ("method", "group_size", "message"),
    [
        (
            "int3",
            32,
            r"quantization 'int3' is not supported; use one of \['auto', 'none', 'int8', 'int4'\]",
        ),
        ("int4", 48, r"quantization_group_size 48 is not supported for int4; use one of \[32"),
        ("int4", "32", "quantization_group_size must be an integer"),
    ],
)
def test_bad_method_or_group_size_is_refused_with_the_accepted_values(method, group_size, message):
    with pytest.raises(ValueError, match=message):
        check_quantization(method, group_size)
    with pytest.raises(ConfigError, match=message):
        EngineConfig("d", quantization=method, quantization_group_size=group_size)


def test_a_bad_kv_cache_dtype_is_refused_with_the_accepted_values():
    with pytest.raises(ConfigError, match=r"kv_cache_dtype 'fp4' .* \['auto', 'int8'\]"):
        EngineConfig("d", kv_cache_dtype="fp4")


def test_a_layer_whose_width_the_group_size_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="96 input features cannot be quantized in groups of 64"):
        Int4Linear(torch.randn(64, 96), None, 64)


def test_int8_kv_quantization_round_trips_each_row_within_its_scale():
    x = torch.randn(50, 3, 64, dtype=torch.bfloat16) * 4
    codes, scales = quantize_kv(x)
    assert codes.dtype is torch.int8
    assert scales.shape == (50, 3)
    restored = dequantize_kv(codes, scales, torch.bfloat16)
    assert relative_error(restored, x) < 0.01


def test_an_int8_kv_cache_takes_about_half_the_bytes_per_token():
    bf16 = KVCacheSpec(30, 3, 64, 16, torch.bfloat16)
    int8 = KVCacheSpec(30, 3, 64, 16, torch.bfloat16, cache_dtype="int8")
    assert bf16.bytes_per_token == 2 * 30 * 3 * 64 * 2
    assert int8.bytes_per_token == 2 * 30 * 3 * (64 + 2)
    assert int8.bytes_per_block == 16 * int8.bytes_per_token


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
# NOTE: logits of a random 2-layer model (wide initialisation) drift ~0.2 under int4; the real
# model's bounds are in test_quality.py.
@pytest.mark.parametrize(("method", "bound"), [("int8", 0.1), ("int4", 0.3)])
def test_quantize_model_swaps_every_linear_and_the_embedding_and_frees_the_float_weights(
    tiny_model_dir, kind, method, bound
):
    float_runner = make_tiny_runner(tiny_model_dir(kind))
    runner = make_tiny_runner(tiny_model_dir(kind), quantization=method)
    model = runner.model
    assert not [m for m in model.modules() if type(m) in (nn.Linear, nn.Embedding)]
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    assert isinstance(model.lm_head, QuantizedLinear)
    owners = {name.split(".")[-2] for name, _ in model.named_parameters()}
    assert owners <= {"input_layernorm", "post_attention_layernorm", "norm"}
    assert runner.weight_bytes == model_weight_bytes(model)
    assert runner.weight_bytes < 0.6 * float_runner.weight_bytes
    prompt = BatchEntry(list(range(3, 40)), 0, [0, 1, 2])
    expected = float_runner.execute([prompt])
    assert relative_error(runner.execute([prompt]), expected) < bound


def test_a_tied_model_quantizes_its_embedding_once_for_lookup_and_logits(tiny_model_dir):
    model = make_tiny_runner(tiny_model_dir("llama"), quantization="int4").model
    assert model.lm_head is model.embed_tokens.table
    assert isinstance(model.lm_head, Int8Linear)  # the table stays int8 (quantization.py)


@pytest.mark.parametrize("method", ["none", "auto"])
def test_quantizing_with_none_or_auto_leaves_a_float_model_untouched(tiny_model_dir, method):
    model = make_tiny_runner(tiny_model_dir("qwen2")).model
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert quantize_model(model, method) is model
    assert linears == [m for m in model.modules() if isinstance(m, nn.Linear)]


def test_weight_formats_count_each_matrix_once_a_tied_table_included(tiny_model_dir):
    float_model = make_tiny_runner(tiny_model_dir("llama")).model  # tied, 2 layers
    assert weight_formats(float_model) == {"float": 2 * 4 + 1}
    model = quantize_model(float_model, "int4")
    assert weight_formats(model) == {"int4": 2 * 4, "int8": 1}


# ---- layers from already quantized weights (GGUF checkpoints: gguf_checkpoint.py) ----


def int4_groups(num_rows: int, num_columns: int) -> tuple[torch.Tensor, ...]:
    """Random codes, positive scales and offsets of groups that straddle zero (as a GGUF's)."""
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (num_rows, num_columns), dtype=torch.uint8, generator=generator)
    scales = torch.rand(num_rows, num_columns // 32, generator=generator) * 0.01 + 1e-3
    offsets = -scales * (1 + 13 * torch.rand(num_rows, num_columns // 32, generator=generator))
    return codes, scales, offsets


def from_groups(codes, scales, offsets) -> torch.Tensor:
    num_rows, num_columns = codes.shape
    grouped = codes.view(num_rows, -1, 32).float() * scales[..., None] + offsets[..., None]
    return grouped.view(num_rows, num_columns)


def test_int4_layers_from_codes_keep_them_in_pytorchs_format():
    codes, scales, offsets = int4_groups(100, 128)  # rows padded to 128
    layer = Int4Linear.from_codes(
        codes, scales, offsets, None, 32, dtype=torch.float32, native_kernels=False
    )
    assert not layer.is_native
    assert torch.equal(unpack_int4(layer.weight_int4)[:100], codes)
    expected = from_groups(codes, scales, offsets)
    torch.testing.assert_close(layer.dequantize_rows(0, 100, torch.float32), expected)
    x = torch.randn(3, 128)
    torch.testing.assert_close(layer(x), x @ expected.T, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(
    not native_int4.is_supported(128, 32), reason="the native int4 kernel does not run here"
)
def test_int4_layers_from_codes_on_the_native_grid_move_weights_by_bf16_rounding_at_most():
    codes, scales, offsets = int4_groups(128, 128)
    # two groups of one sign (no zero point in a byte for them): refitted from their values
    offsets[5, 1], offsets[70, 3] = 0.02, -0.5
    layer = Int4Linear.from_codes(codes.clone(), scales, offsets, None, 32, dtype=torch.bfloat16)
    assert layer.is_native and layer.num_refitted_groups == 2
    expected = from_groups(codes, scales, offsets)
    values = layer.dequantize_rows(0, 128, torch.float32)
    bf16_scales = scales.bfloat16().float()[..., None]
    bound = 15 * (scales[..., None] - bf16_scales).abs() + bf16_scales / 32 + 1e-6
    error = (values - expected).view(128, -1, 32).abs()
    assert (error > bound).any(dim=-1).nonzero().tolist() == [[5, 1], [70, 3]]
    unchanged = torch.ones(128, 4, dtype=torch.bool)
    unchanged[5, 1] = unchanged[70, 3] = False
    native_codes = unpack_int4_vnni(layer.weight_int4).view(128, -1, 32)
    assert torch.equal(native_codes[unchanged], codes.view(128, -1, 32)[unchanged])
    assert relative_error(values[5, 32:64], expected[5, 32:64]) < 0.05


def test_int8_layers_from_codes_quantized_a_chunk_of_rows_at_a_time_are_the_whole_layers():
    weight = torch.randn(100, 64, dtype=torch.bfloat16)
    whole = Int8Linear(weight, None)
    chunks = [quantize_rows_int8(weight[start : start + 30].float(), torch.bfloat16)
              for start in range(0, 100, 30)]  # fmt: skip
    layer = Int8Linear.from_codes(
        torch.cat([codes for codes, _ in chunks]), torch.cat([s for _, s in chunks]), None
    )
    assert torch.equal(layer.weight_int8, whole.weight_int8)
    assert torch.equal(layer.scales, whole.scales)


def test_a_model_runner_with_an_int8_kv_cache_stays_close_to_the_float_cache(tiny_model_dir):
    float_runner = make_tiny_runner(tiny_model_dir("llama"))
    runner = make_tiny_runner(tiny_model_dir("llama"), kv_cache_dtype="int8")
    assert runner.kv_cache.layers[0][0].dtype is torch.int8
    assert len(runner.kv_cache.layers[0]) == 4
    prompt = list(range(5, 45))
    for r in (float_runner, runner):  # a chunked prefill, then decodes that read the cache
        r.execute([BatchEntry(prompt[:24], 0, [0, 1, 2])])
        r.execute([BatchEntry(prompt[24:], 24, [0, 1, 2])])
    decode = [BatchEntry([7], 40, [0, 1, 2]), BatchEntry([9], 40, [0, 1, 2])]
    assert relative_error(runner.execute(decode), float_runner.execute(decode)) < 0.05


def make_tiny_runner(model_dir, **options) -> ModelRunner:
    config = EngineConfig(
        model_dir, dtype=torch.float32, kv_cache_mb=1, block_size=16, max_model_len=64, **options
    )
    return ModelRunner(config)


# ---- the real model through the engine ----


@pytest.mark.real_weights
@pytest.mark.parametrize(
    ("quantization", "kv_cache_dtype", "max_weight_share"),
    [("int8", "auto", 0.55), ("int4", "int8", 0.36), ("none", "int8", 1.0)],
)
def test_the_engine_generates_with_quantized_weights_and_kv_cache(
    chat_model_dir, quantization, kv_cache_dtype, max_weight_share
):
    from inference.engine.core.sampling_params import SamplingParams
    from inference.engine.engine import Engine

    settings = {"kv_cache_mb": 32, "max_model_len": 512, "dtype": "bfloat16"}
    config = EngineConfig(
        chat_model_dir, quantization=quantization, kv_cache_dtype=kv_cache_dtype, **settings
    )
    engine = Engine(config)
    try:
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        results = engine.generate(["The capital of France is", "Water boils at"], params)
    finally:
        engine.shutdown()
    assert [len(r.token_ids) for r in results] == [24, 24]
    assert all(r.text.strip() for r in results)
    bf16_model = load_model(chat_model_dir, dtype=torch.bfloat16).model
    assert engine.runner.weight_bytes <= max_weight_share * model_weight_bytes(bf16_model)
    assert engine.runner.kv_cache.spec.cache_dtype == kv_cache_dtype
