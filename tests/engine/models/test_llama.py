"""The Llama-family decoder: config parsing, RoPE, and numerics against transformers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from inference.engine.layers.attention import build_attention_metadata
from inference.engine.loader import load_model
from inference.engine.models.llama import (
    LlamaArgs,
    RMSNorm,
    RopeArgs,
    RotaryEmbedding,
    apply_rotary,
    rope_inv_freq,
)

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers_bitwise(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    ours, theirs = RMSNorm(64, eps=1e-5), LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.1)
        ours.weight.copy_(theirs.weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = (torch.randn(7, 64) * 3).to(dtype)
    residual = (torch.randn(7, 64) * 3).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x)[0], theirs(x))
        # with the residual stream: the add transformers' decoder layer does before its norm
        normed, stream = ours(x, residual.clone())
        assert torch.equal(stream, residual + x)
        assert torch.equal(normed, theirs(residual + x))


def test_qwen2_gets_q_k_v_biases_but_no_output_bias():
    from transformers import Qwen2Config

    args = LlamaArgs.from_hf_config(Qwen2Config())
    assert (args.qkv_bias, args.o_bias) == (True, False)


def test_mistral_sliding_window_caps_the_usable_length():
    from transformers import MistralConfig

    args = LlamaArgs.from_hf_config(
        MistralConfig(max_position_embeddings=32768, sliding_window=4096)
    )
    assert args.max_position_embeddings == 4096


@pytest.mark.parametrize("kind", ["qwen2", "llama", "mistral"])
def test_prompt_logits_match_transformers_forward(tiny_model_dir, kind):
    from transformers import AutoModelForCausalLM

    directory = tiny_model_dir(kind)
    hf_model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    model = load_model(directory, dtype=torch.float32).model
    args = model.args
    torch.manual_seed(1)
    input_ids = torch.randint(0, args.vocab_size, (20,))
    shape = (4, args.num_kv_heads, 8, args.head_dim)
    kv_caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(args.num_layers)]
    metadata = build_attention_metadata(
        [20], [0], [[2, 0, 3]], block_size=8, num_kv_heads=args.num_kv_heads
    )
    with torch.inference_mode():
        hidden = model(input_ids, metadata.positions, metadata, kv_caches)
        logits = model.compute_logits(hidden)
        expected = hf_model(input_ids[None]).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
