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
    # The sliding-window ones: windows of TINY_SLIDING_WINDOW tokens, so that sequences of a
    # hundred tokens reach past them.
    "mistral-window": {
        "model_type": "mistral",  # every layer slides
        "tie_word_embeddings": False,
        "sliding_window": 24,
    },
    "qwen2-window": {
        "model_type": "qwen2",  # layers from max_window_layers on slide
        "tie_word_embeddings": True,
        "use_sliding_window": True,
        "sliding_window": 24,
        "max_window_layers": 1,
    },
    "qwen3": {
        "model_type": "qwen3",  # per-head q/k norms, head_dim != hidden / heads, no biases
        "tie_word_embeddings": True,
        "head_dim": 32,
    },
    "gemma3": {
        "model_type": "gemma3_text",  # two local layers, then a global one
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "sliding_window": 24,
        "head_dim": 32,
        "query_pre_attn_scalar": 24,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 2.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
        },
    },
    "gemma3-softcap": {
        # capped final logits; the attention cap transformers' Gemma 3 ignores (so must we)
        "model_type": "gemma3_text",
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 24,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": 3.0,
    },
}
TINY_SLIDING_WINDOW = 24


def save_tiny_model(kind: str, directory: Path) -> Path:
    """Save a 2-layer random model of family `kind` (a key of TINY_MODEL_CONFIGS) in `directory`."""
    # NOTE: imported here, so the many test runs that build no tiny model do not load transformers.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    options = dict(TINY_MODEL_CONFIGS[kind])
    shape = {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "initializer_range": 0.1,
    }
    config = AutoConfig.for_model(options.pop("model_type"), **(shape | options))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        # NOTE: non-trivial biases and norm weights, so a mis-mapped one shows up.
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.save_pretrained(directory)
    return directory


def save_tiny_multimodal_gemma3(directory: Path) -> Path:
    """Save a random Gemma 3 image-text model (model_type gemma3, the decoder's settings in
    text_config, a vision tower beside it) whose decoder is the tiny "gemma3" one."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = dict(TINY_MODEL_CONFIGS["gemma3"])
    text.pop("model_type")
    text |= {
        "vocab_size": 300,  # the tokens below 297, then the image markers
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "initializer_range": 0.1,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 14,
    }
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=297,
        eoi_token_index=298,
        image_token_index=299,
    )
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.save_pretrained(directory)
    return directory
