"""Shared fixtures. Models come from the real packaged files (HF_HUB_OFFLINE=1 in the suite)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def chat_model_dir() -> Path:
    """The bundled SmolLM2-135M-Instruct, converted once into the models cache of the data dir."""
    from django.conf import settings

    from inference.model_files import resolve_chat_model

    return resolve_chat_model(None, Path(settings.MODELS_DIR)).directory


@pytest.fixture(scope="session")
def real_tokenizer(chat_model_dir):
    """The bundled chat model's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(chat_model_dir))


@pytest.fixture(scope="session")
def embedding_model_dir() -> Path:
    from inference.model_files import resolve_embedding_model

    return resolve_embedding_model(None).directory


# NOTE: tiny randomly initialised checkpoints for engine tests that must not depend on the real
# model. initializer_range is larger than the default so greedy choices are not near-ties.
TINY_MODEL_CONFIGS = {
    "qwen2": {
        "model_type": "qwen2",  # q/k/v biases, untied lm_head
        "tie_word_embeddings": False,
    },
    "llama": {
        "model_type": "llama",  # tied embeddings, llama3 RoPE, all biases, explicit head_dim
        "tie_word_embeddings": True,
        "head_dim": 32,
        "attention_bias": True,
        "mlp_bias": True,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "mistral": {
        "model_type": "mistral",  # linear RoPE scaling
        "tie_word_embeddings": False,
        "sliding_window": None,
        "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    },
}


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests (`pytest.mark.usefixtures("one_torch_thread")`).

    NOTE: the test machines are 2 shared cores; two OpenMP threads stall badly whenever a
    neighbour holds a core, and these tests are about outputs, not speed.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory: `tiny_model_dir("qwen2")` -> directory of a saved 2-layer random model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    made: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in made:
            options = dict(TINY_MODEL_CONFIGS[kind])
            config = AutoConfig.for_model(
                options.pop("model_type"),
                vocab_size=256,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=512,
                initializer_range=0.1,
                **options,
            )
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config)
            with torch.no_grad():
                # NOTE: non-trivial biases and norm weights, so a mis-mapped one shows up.
                for name, param in model.named_parameters():
                    if param.ndim == 1:
                        param.normal_(1.0 if "norm" in name else 0.0, 0.1)
            directory = tmp_path_factory.mktemp(f"tiny-{kind}")
            model.save_pretrained(directory)
            made[kind] = directory
        return made[kind]

    return make
