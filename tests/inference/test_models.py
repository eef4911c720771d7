"""inference.models.ModelConfig: validation refuses what the engine could not load."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from inference.models import ModelConfig

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
        "model type 'gpt2' is not supported; supported: llama, mistral, qwen2"
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
    assert "group" in errors["quantization_group_size"][0]


def test_speculative_tokens_beyond_the_engine_limit_are_refused(chat_model_dir) -> None:
    errors = errors_of(ModelConfig(name="s", num_speculative_tokens=64))
    assert errors["num_speculative_tokens"]


def test_the_speed_options_reach_the_engine_config(chat_model_dir) -> None:
    from inference.runtime import engine_config_for

    config = ModelConfig(
        name="fast", quantization="int8", kv_cache_dtype="int8", num_speculative_tokens=3
    )
    engine_config = engine_config_for(config)
    assert (engine_config.quantization, engine_config.kv_cache_dtype) == ("int8", "int8")
    assert engine_config.num_speculative_tokens == 3


def test_max_model_len_cannot_exceed_the_models_positions(chat_model_dir) -> None:
    errors = errors_of(ModelConfig(name="long", max_model_len=100_000, kv_cache_mb=4096))
    assert errors["max_model_len"] == ["the model supports at most 8192 positions"]


def test_the_token_budget_must_cover_one_decode_per_running_request(chat_model_dir) -> None:
    errors = errors_of(ModelConfig(name="b", max_num_seqs=64, max_num_batched_tokens=32))
    assert "at least max_num_seqs" in errors["max_num_batched_tokens"][0]


def test_only_one_configuration_is_active_and_activate_moves_the_flag(chat_model_dir) -> None:
    first = ModelConfig.objects.create(name="first", is_active=True)
    second = ModelConfig.objects.create(name="second")
    second.activate()
    first.refresh_from_db()
    assert (first.is_active, second.is_active) == (False, True)
    assert ModelConfig.active() == second
    with pytest.raises(IntegrityError), transaction.atomic():
        ModelConfig.objects.filter(pk=first.pk).update(is_active=True)
