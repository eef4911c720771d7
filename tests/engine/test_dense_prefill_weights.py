"""Dense prefill weights: quantized layers keep a dense copy for prefill-sized steps.

The copy holds the dequantized weight exactly, so a prefill through it gives the dequantizing
path's results; the kernel still serves decodes. Real SmolLM2 GGUF weights (int4 and int8
layers), float32 so that results compare tightly.
"""

from __future__ import annotations

import pytest
import torch

from inference.engine import ConfigError, EngineConfig
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.kernels import has_amx
from inference.engine.layers.quantization import QuantizedLinear
from inference.engine.model_runner import DENSE_AMX_KERNEL_TOKENS, ModelRunner
from tests.engine.real_model import RealEngines, chat

pytestmark = pytest.mark.real_weights

MAX_MODEL_LEN = 512


def quantized_runner(model_dir, dtype: str, prefill_weights: str) -> ModelRunner:
    config = EngineConfig(
        model_dir,
        dtype=dtype,
        quantization="auto",  # the GGUF's own int4/int8 tensors
        kv_cache_mb=32,
        max_model_len=MAX_MODEL_LEN,
        prefill_weights=prefill_weights,
    )
    return ModelRunner(config)


def quantized_layers(runner: ModelRunner) -> list[QuantizedLinear]:
    return [m for m in runner.model.modules() if isinstance(m, QuantizedLinear)]


def test_a_dense_copy_multiplies_like_the_dequantizing_path(chat_model_dir) -> None:
    runner = quantized_runner(chat_model_dir, "float32", "quantized")
    layers = [layer for layer in quantized_layers(runner) if layer is not runner.model.lm_head]
    assert layers and runner.dense_weight_bytes == 0
    generator = torch.Generator().manual_seed(0)
    for layer in layers[:8]:
        x = torch.randn(40, layer.in_features, generator=generator)
        expected = layer.dequantized_matmul(x)
        num_bytes = layer.keep_dense_weight(DENSE_AMX_KERNEL_TOKENS)
        assert num_bytes == layer.in_features * layer.out_features * 4
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
        assert layer.max_kernel_tokens <= DENSE_AMX_KERNEL_TOKENS


def test_an_engine_with_dense_prefill_weights_answers_as_one_without(
    chat_model_dir, real_tokenizer
) -> None:
    prompt = chat(real_tokenizer, "Name three rivers of Europe and the seas they flow into.")
    params = SamplingParams(temperature=0, max_tokens=12)
    answers = {}
    for setting in ("quantized", "dense"):
        runner = quantized_runner(chat_model_dir, "float32", setting)
        assert (runner.dense_weight_bytes > 0) == (setting == "dense")
        engines = RealEngines(runner, real_tokenizer, chat_model_dir, MAX_MODEL_LEN)
        try:
            engine = engines.make(quantization="auto", prefill_weights=setting)
            answers[setting] = engine.generate([prompt], params)[0].token_ids
        finally:
            engines.shutdown()
    assert answers["dense"] == answers["quantized"]


def test_auto_keeps_dense_copies_only_for_bf16_on_cpus_with_amx(chat_model_dir) -> None:
    runner = quantized_runner(chat_model_dir, "bfloat16", "auto")
    assert (runner.dense_weight_bytes > 0) == has_amx()
    assert quantized_runner(chat_model_dir, "float32", "auto").dense_weight_bytes == 0


def test_an_unknown_prefill_weights_setting_is_refused(chat_model_dir) -> None:
    with pytest.raises(ConfigError, match="prefill_weights must be one of"):
        EngineConfig(chat_model_dir, prefill_weights="fast")
