"""The registry of architectures by model_type: what the loader and the admin accept."""

from __future__ import annotations

import pytest

import inference.engine
from inference.engine.models.gemma3 import Gemma3ForCausalLM
from inference.engine.models.llama import LlamaForCausalLM
from inference.engine.models.registry import SUPPORTED_MODEL_TYPES, architecture_of


def test_each_family_is_served_by_its_module():
    for model_type in ("llama", "mistral", "qwen2", "qwen3"):
        assert architecture_of(model_type) is LlamaForCausalLM
    for model_type in ("gemma3_text", "gemma3"):
        assert architecture_of(model_type) is Gemma3ForCausalLM


def test_the_engine_api_lists_the_registry_model_types():
    assert inference.engine.SUPPORTED_MODEL_TYPES == SUPPORTED_MODEL_TYPES


def test_unknown_model_type_is_refused_naming_the_supported_ones():
    with pytest.raises(ValueError, match=r"'gpt2' is not supported.*supported: llama, mistral"):
        architecture_of("gpt2")
