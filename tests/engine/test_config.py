"""EngineConfig: validation with clear errors, dtype names, KV budget in bytes."""

from __future__ import annotations

import pytest
import torch

from inference.engine.config import ConfigError, EngineConfig, has_fast_bfloat16, resolve_device


def test_defaults_convert_the_dtype_name_and_the_kv_budget():
    config = EngineConfig("some/dir", dtype="bf16", kv_cache_mb=1.5)
    assert config.dtype is torch.bfloat16
    assert config.kv_cache_bytes == 1_572_864
    assert config.enable_prefix_caching
    assert config.block_size == 16


def test_auto_dtype_is_bfloat16_only_where_the_hardware_runs_it_natively():
    expected = torch.bfloat16 if has_fast_bfloat16("cpu") else torch.float32
    assert EngineConfig("d").dtype is expected
    assert EngineConfig("d", dtype="auto").dtype is expected


def test_torch_dtypes_are_accepted():
    assert EngineConfig("d", dtype=torch.float32).dtype is torch.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "int8"}, "dtype 'int8' is not supported"),
        ({"max_model_len": 1}, "max_model_len must be >= 2"),
        ({"block_size": 0}, "block_size must be >= 1"),
        ({"max_num_seqs": "4"}, "max_num_seqs must be an integer"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be >= 1"),
        ({"max_num_batched_tokens": 8}, r"max_num_batched_tokens \(8\) must be >= max_num_seqs"),
        ({"kv_cache_mb": 0}, "kv_cache_mb must be > 0"),
        ({"kv_cache_mb": "lots"}, "kv_cache_mb must be a number"),
        ({"enable_prefix_caching": 1}, "enable_prefix_caching must be True or False"),
        ({"num_speculative_tokens": -1}, "num_speculative_tokens must be >= 0"),
        ({"num_speculative_tokens": 17}, "num_speculative_tokens must be <= 16"),
        ({"num_speculative_tokens": 2.0}, "num_speculative_tokens must be an integer"),
        ({"speculative_ngram_min": 0}, "speculative_ngram_min must be >= 1"),
        (
            {"speculative_ngram_min": 3, "speculative_ngram_max": 2},
            r"speculative_ngram_max \(2\) must be >= speculative_ngram_min \(3\)",
        ),
        ({"speculative_max_num_seqs": 0}, "speculative_max_num_seqs must be >= 1"),
        ({"speculative_method": "eagle"}, "speculative_method 'eagle' is not supported"),
        ({"prefill_attention": "flash"}, r"prefill_attention must be one of \['auto', 'native'"),
        ({"speculative_method": "draft"}, "speculative_method 'draft' needs draft_model_dir"),
        ({"draft_model_dir": "small"}, "draft_model_dir is only used with speculative_method"),
        (
            {"speculative_method": "draft", "draft_model_dir": "d", "draft_kv_cache_mb": 0},
            "draft_kv_cache_mb must be > 0",
        ),
    ],
)
def test_bad_settings_raise_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig("d", **kwargs)


def test_the_draft_models_config_keeps_the_formats_and_sizes_its_own_kv_cache():
    config = EngineConfig(
        "target",
        dtype="float32",
        quantization="int4",
        num_speculative_tokens=4,
        speculative_method="draft",
        draft_model_dir="draft",
        draft_kv_cache_mb=32,
    )
    assert config.uses_draft_model
    draft = config.draft_config()
    assert draft.model_dir.name == "draft"
    assert (draft.quantization, draft.dtype) == ("int4", torch.float32)
    assert (draft.kv_cache_mb, draft.num_speculative_tokens, draft.draft_model_dir) == (32, 0, None)


def test_the_draft_can_load_in_other_weight_formats_than_its_target():
    settings = {"speculative_method": "draft", "num_speculative_tokens": 4}
    config = EngineConfig(
        "target",
        **settings,
        draft_model_dir="draft",
        quantization="auto",
        draft_quantization="int4",
    )
    draft = config.draft_config()
    assert (config.quantization, draft.quantization, draft.draft_quantization) == (
        "auto",
        "int4",
        None,
    )
    with pytest.raises(ConfigError, match="^draft_quantization: "):
        EngineConfig("target", **settings, draft_model_dir="draft", draft_quantization="int3")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_auto_runs_the_engine_on_cuda_where_pytorch_sees_it_else_on_the_cpu() -> None:
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(" CPU ") == "cpu"


@pytest.mark.parametrize("name", ["tpu", "", "cuda:x", 3])
def test_a_device_that_is_not_cpu_or_cuda_is_refused(name) -> None:
    with pytest.raises(ConfigError, match="device must be"):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_cuda_device_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="PyTorch sees no CUDA device"):
        resolve_device("cuda:0")
