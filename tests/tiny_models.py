"""Tiny randomly initialised checkpoints, for engine tests that must not depend on the real model.

One per architecture family the engine loads: `save_tiny_model("qwen2", directory)`.
"""

from __future__ import annotations

from pathlib import Path

# NOTE: initializer_range is larger than the default so greedy choices are not near-ties.
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


def save_tiny_model(kind: str, directory: Path) -> Path:
    """Save a 2-layer random model of family `kind` (a key of TINY_MODEL_CONFIGS) in `directory`."""
    # NOTE: imported here, so the many test runs that build no tiny model do not load transformers.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

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
    model.save_pretrained(directory)
    return directory
