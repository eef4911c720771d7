"""inference.models.ModelConfig: EngineConfig's settings by name, refused when the engine would."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from inference.engine import EngineConfig
from inference.engine.config import DTYPE_NAMES, SPECULATIVE_METHODS
from inference.engine.kv_cache import KV_CACHE_DTYPES
from inference.engine.layers.quantization import QUANTIZATION_METHODS
from inference.models import APP_DEFAULT_OVERRIDES, APP_FIELDS, ModelConfig

pytestmark = pytest.mark.django_db


def errors_of(config: ModelConfig) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        config.full_clean()
    return caught.value.message_dict


def test_the_default_configuration_is_valid(chat_model_dir) -> None:
    ModelConfig(name="default").full_clean()


def test_an_unknown_model_source_is_refused_with_the_reason(tmp_path) -> None:
    errors = errors_of(ModelConfig(name="x", source=str(tmp_path / "missing")))
    assert "no such file or directory" in errors["source"][0]
    errors = errors_of(ModelConfig(name="y", source="someone/not-in-the-cache"))
    assert "not in the local Hugging Face cache" in errors["source"][0]


def test_an_unsupported_architecture_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    errors = errors_of(ModelConfig(name="gpt2", source=str(tmp_path)))
    assert errors["source"] == [
        "model type 'gpt2' is not supported; "
        "supported: gemma3, gemma3_text, llama, mistral, qwen2, qwen3"
    ]


def test_a_kv_budget_too_small_for_one_sequence_names_the_minimum(chat_model_dir) -> None:
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x 2 (K and V) x 2 bytes = 23,040 B/token.
    config = ModelConfig(name="tiny", dtype="bfloat16", kv_cache_mb=1, max_model_len=4096)
    errors = errors_of(config)
    assert errors["kv_cache_mb"] == [
        "too small to hold one 4096-token sequence: needs at least 90 MB for this model and dtype"
    ]


def test_an_int8_kv_cache_lowers_the_minimum_kv_budget(chat_model_dir) -> None:
    # int8 codes plus one bf16 scale per head and token: 30 x 3 x (64 + 2) x 2 = 11,880 B/token.
    config = ModelConfig(
        name="tiny", dtype="bfloat16", kv_cache_dtype="int8", kv_cache_mb=1, max_model_len=4096
    )
    assert errors_of(config)["kv_cache_mb"] == [
        "too small to hold one 4096-token sequence: needs at least 47 MB for this model and dtype"
    ]


def test_an_int4_group_size_that_is_not_a_power_of_two_is_refused(chat_model_dir) -> None:
    errors = errors_of(ModelConfig(name="q", quantization="int4", quantization_group_size=48))
    assert errors == {  # EngineConfig's check, under the field it names
        "quantization_group_size": [
            "quantization_group_size 48 is not supported for int4; use one of [32, 64, 128, 256]"
        ]
    }


def test_speculative_tokens_beyond_the_engine_limit_are_refused(chat_model_dir) -> None:
    errors = errors_of(ModelConfig(name="s", num_speculative_tokens=64))
    assert errors["num_speculative_tokens"] == ["num_speculative_tokens must be <= 16, got 64"]


def test_the_speed_options_reach_the_engine_config(chat_model_dir) -> None:
    from inference.runtime import engine_config_for

    config = ModelConfig(
        name="fast", quantization="int8", kv_cache_dtype="int8", num_speculative_tokens=3
    )
    engine_config = engine_config_for(config)
    assert (engine_config.quantization, engine_config.kv_cache_dtype) == ("int8", "int8")
    assert engine_config.num_speculative_tokens == 3


def test_the_draft_model_reaches_the_engine_config_as_a_directory(chat_model_dir) -> None:
    from inference.runtime import engine_config_for

    config = ModelConfig(name="draft", speculative_method="draft", draft_source=str(chat_model_dir))
    config.full_clean()  # a model may draft for itself
    engine_config = engine_config_for(config)
    assert (engine_config.speculative_method, engine_config.draft_model_dir) == (
        "draft",
        chat_model_dir,
    )
    # The n-gram method ignores a draft source left in the form.
    config.speculative_method = "ngram"
    assert engine_config_for(config).draft_model_dir is None


def test_a_draft_kv_budget_too_small_for_one_sequence_names_the_minimum(chat_model_dir) -> None:
    config = ModelConfig(
        name="d",
        dtype="bfloat16",
        max_model_len=4096,
        speculative_method="draft",
        draft_source=str(chat_model_dir),
        draft_kv_cache_mb=8,
    )
    assert errors_of(config) == {  # SmolLM2-135M drafting for itself: 23,040 B/token
        "draft_kv_cache_mb": [
            "too small to hold one 4096-token sequence: needs at least 90 MB for the draft "
            "model and dtype"
        ]
    }


def test_the_draft_method_without_a_draft_model_is_refused_on_the_draft_source(
    chat_model_dir,
) -> None:
    errors = errors_of(ModelConfig(name="d", speculative_method="draft"))
    assert errors == {"draft_source": ["the speculative method 'draft' needs a draft model"]}


def test_a_draft_of_another_vocabulary_is_refused_naming_both_models(
    chat_model_dir, catalogue_gguf, settings
) -> None:
    from inference.model_files import resolve_chat_model

    qwen = "qwen2.5-coder-0.5b-instruct"
    catalogue_gguf(qwen)
    resolve_chat_model(qwen, settings.MODELS_DIR, model_cache=settings.CACHET_MODEL_CACHE)
    errors = errors_of(ModelConfig(name="d", speculative_method="draft", draft_source=qwen))
    [message] = errors["draft_source"]
    assert message.startswith(f"{qwen} cannot draft for {settings.CACHET_MODEL}: ")
    assert "vocabulary sizes differ (49152 vs 151936)" in message


def test_max_model_len_cannot_exceed_the_models_positions(chat_model_dir) -> None:
    errors = errors_of(ModelConfig(name="long", max_model_len=100_000, kv_cache_mb=4096))
    assert errors["max_model_len"] == ["the model supports at most 8192 positions"]


def test_the_token_budget_must_cover_one_decode_per_running_request(chat_model_dir) -> None:
    errors = errors_of(ModelConfig(name="b", max_num_seqs=64, max_num_batched_tokens=32))
    assert errors["max_num_batched_tokens"] == [
        "max_num_batched_tokens (32) must be >= max_num_seqs (64)"
    ]


def test_only_one_configuration_is_active_and_activate_moves_the_flag(chat_model_dir) -> None:
    first = ModelConfig.objects.create(name="first", is_active=True)
    second = ModelConfig.objects.create(name="second")
    second.activate()
    first.refresh_from_db()
    assert (first.is_active, second.is_active) == (False, True)
    assert ModelConfig.active() == second
    with pytest.raises(IntegrityError), transaction.atomic():
        ModelConfig.objects.filter(pk=first.pk).update(is_active=True)


# ---- The mapping onto EngineConfig, by field name ----

ENGINE_FIELD_DEFAULTS = {field.name: field.default for field in dataclasses.fields(EngineConfig)}
# A value other than the default for every engine setting the admin edits.
NON_DEFAULT_SETTINGS = {
    "dtype": "float32",
    "max_model_len": 1024,
    "kv_cache_mb": 64,
    "block_size": 32,
    "max_num_seqs": 3,
    "max_num_batched_tokens": 96,
    "enable_prefix_caching": False,
    "quantization": "int4",
    "quantization_group_size": 64,
    "kv_cache_dtype": "int8",
    "num_speculative_tokens": 2,
    "speculative_method": "draft",
    "draft_kv_cache_mb": 32,
    "draft_quantization": "int4",
}


def model_field_names() -> set[str]:
    return {field.name for field in ModelConfig._meta.concrete_fields}


def test_every_field_is_an_engine_setting_named_as_in_engine_config_or_an_app_field() -> None:
    engine_fields = model_field_names() - APP_FIELDS
    assert engine_fields <= set(ENGINE_FIELD_DEFAULTS), "not EngineConfig names nor APP_FIELDS"
    assert not APP_FIELDS & set(ENGINE_FIELD_DEFAULTS)
    assert model_field_names() >= APP_FIELDS


def test_every_shared_setting_reaches_the_engine_config_by_name(tmp_path: Path) -> None:
    shared = model_field_names() & set(ENGINE_FIELD_DEFAULTS)
    assert set(NON_DEFAULT_SETTINGS) == shared, "give each shared setting a non-default value"
    config = ModelConfig(name="all-set", **NON_DEFAULT_SETTINGS)
    engine_config = config.engine_config(tmp_path, draft_model_dir=tmp_path / "draft")
    for name, value in NON_DEFAULT_SETTINGS.items():
        assert value != ModelConfig._meta.get_field(name).default, name
        expected = torch.float32 if name == "dtype" else value
        assert getattr(engine_config, name) == expected, name
    assert engine_config.model_dir == tmp_path
    assert engine_config.draft_model_dir == tmp_path / "draft"


def test_the_process_wide_settings_reach_every_engine_config(settings, tmp_path: Path) -> None:
    settings.CACHET_TORCH_THREADS = 1
    settings.CACHET_NATIVE_KERNELS = False
    settings.CACHET_FUSED_DECODE = False
    settings.CACHET_ADAPTIVE_THREADS = False
    engine_config = ModelConfig(name="p").engine_config(tmp_path)
    assert (engine_config.native_kernels, engine_config.fused_decode) == (False, False)
    assert engine_config.adaptive_threads is False
    assert engine_config.num_threads == 1


def test_the_defaults_are_engine_configs_but_for_the_named_app_overrides() -> None:
    for name in ModelConfig.engine_field_names():
        expected = APP_DEFAULT_OVERRIDES.get(name, ENGINE_FIELD_DEFAULTS[name])
        assert ModelConfig._meta.get_field(name).default == expected, name
    for name, value in APP_DEFAULT_OVERRIDES.items():
        assert value != ENGINE_FIELD_DEFAULTS[name], f"{name}: an override equal to the default"
    assert ModelConfig().kv_cache_mb == ENGINE_FIELD_DEFAULTS["kv_cache_mb"] == 512


def test_the_admin_offers_exactly_the_values_the_engine_accepts() -> None:
    assert set(ModelConfig.Dtype.values) == {"auto", *DTYPE_NAMES}
    assert set(ModelConfig.Quantization.values) == set(QUANTIZATION_METHODS)
    assert set(ModelConfig.KvCacheDtype.values) == set(KV_CACHE_DTYPES)
    assert set(ModelConfig.SpeculativeMethod.values) == set(SPECULATIVE_METHODS)
