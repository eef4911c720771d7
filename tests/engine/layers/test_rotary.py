"""RoPE settings, inverse frequencies and the rotation, against transformers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from inference.engine.layers.rotary import RopeArgs, RotaryEmbedding, apply_rotary, rope_inv_freq

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_rope_settings_are_read_from_transformers_5_rope_parameters():
    from transformers import LlamaConfig

    config = LlamaConfig(rope_parameters=LLAMA3_ROPE)
    rope = RopeArgs.from_hf_config(config)
    assert (rope.rope_type, rope.theta, rope.factor) == ("llama3", 500000.0, 8.0)
    assert rope.original_max_position_embeddings == 8192


def test_rope_settings_are_read_from_legacy_rope_scaling_and_rope_theta():
    config = SimpleNamespace(
        rope_scaling={"type": "linear", "factor": 4.0},
        rope_theta=1234.0,
        max_position_embeddings=64,
    )
    rope = RopeArgs.from_hf_config(config)
    assert (rope.rope_type, rope.theta, rope.factor) == ("linear", 1234.0, 4.0)
    no_scaling = RopeArgs.from_hf_config(SimpleNamespace(rope_scaling=None, rope_theta=99.0))
    assert (no_scaling.rope_type, no_scaling.theta) == ("default", 99.0)


def test_unsupported_rope_type_raises_value_error_naming_it():
    config = SimpleNamespace(rope_parameters={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="'yarn' is not supported"):
        RopeArgs.from_hf_config(config)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 100000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        LLAMA3_ROPE,
    ],
    ids=["default", "linear", "llama3"],
)
def test_inverse_frequencies_match_transformers(rope_parameters):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=256, num_attention_heads=4, rope_parameters=rope_parameters)
    expected = LlamaRotaryEmbedding(config).inv_freq
    torch.testing.assert_close(rope_inv_freq(RopeArgs.from_hf_config(config), 64), expected)


def test_rotation_matches_transformers_rotate_half():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    x = torch.randn(5, 3, 16)
    rotary = RotaryEmbedding(RopeArgs(theta=100.0), head_dim=16)
    positions = torch.tensor([0, 1, 7, 30, 2])
    cos, sin = rotary(positions, torch.float32)
    angles = positions[:, None].float() * rotary.inv_freq
    hf_cos = torch.cat([angles.cos()] * 2, -1)
    hf_sin = torch.cat([angles.sin()] * 2, -1)
    expected, _ = apply_rotary_pos_emb(
        x.transpose(0, 1), x.transpose(0, 1), hf_cos, hf_sin, unsqueeze_dim=0
    )
    assert torch.equal(apply_rotary(x, cos, sin), expected.transpose(0, 1))
