"""Gemma 3: config parsing, and logits against transformers' own model through the runner and
the paged KV cache (sliding-window layers interleaved with global ones)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from inference.engine.kernels import paged_prefill_attention
from inference.engine.models.gemma3 import Gemma3Args
from tests.engine.models.paged_schedule import engine_logits, token_sequences, transformers_logits
from tests.tiny_models import TINY_SLIDING_WINDOW, save_tiny_multimodal_gemma3

# NOTE: tiny models: one thread is as fast, and does not stall when a neighbour holds a core.
pytestmark = pytest.mark.usefixtures("torch_threads_on_free_cores")


def test_gemma3_270m_config_gives_five_local_layers_per_global_one_with_their_own_rope_base():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        num_hidden_layers=18,
        sliding_window=512,
        head_dim=256,
        query_pre_attn_scalar=256,
        num_attention_heads=4,
        num_key_value_heads=1,
    )
    args = Gemma3Args.from_hf_config(config)
    assert args.sliding_windows == ((512,) * 5 + (None,)) * 3
    assert (args.rope_local.theta, args.rope_global.theta) == (10_000.0, 1_000_000.0)
    assert (args.query_pre_attn_scalar, args.activation) == (256.0, "gelu_pytorch_tanh")
    assert args.tie_word_embeddings and args.final_logit_softcapping is None


def test_older_gemma3_config_fields_give_the_same_layers_and_rope():
    """rope_local_base_freq, rope_scaling on global layers and sliding_window_pattern."""
    config = SimpleNamespace(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rms_norm_eps=1e-6,
        max_position_embeddings=512,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=32,
        sliding_window=16,
        sliding_window_pattern=2,
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    )
    args = Gemma3Args.from_hf_config(config)
    assert args.sliding_windows == (16, None, 16, None)
    assert (args.rope_global.rope_type, args.rope_global.factor) == ("linear", 8.0)
    assert (args.rope_global.theta, args.rope_local.theta) == (1_000_000.0, 10_000.0)
    assert args.rope_local.rope_type == "default"


def test_bidirectional_gemma3_config_is_refused_as_not_a_causal_model():
    from transformers import Gemma3TextConfig

    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        Gemma3Args.from_hf_config(Gemma3TextConfig(use_bidirectional_attention=True))


@pytest.mark.parametrize("kind", ["gemma3", "gemma3-softcap"])
def test_logits_match_transformers_through_chunked_prefill_a_prefix_hit_and_decodes(
    tiny_model_dir, kind
):
    directory = tiny_model_dir(kind)
    a, b = token_sequences(vocab_size=256)
    ours_a, ours_b = engine_logits(directory, a, b)
    theirs_a, theirs_b = transformers_logits(directory, a, b)
    assert (ours_a - theirs_a).abs().max() < 1e-4
    assert (ours_b - theirs_b).abs().max() < 1e-4


def test_image_text_checkpoint_serves_its_text_decoder(tmp_path):
    """model_type gemma3: text_config, weights under language_model., a vision tower skipped."""
    directory = save_tiny_multimodal_gemma3(tmp_path)
    a, b = token_sequences(vocab_size=297)
    ours_a, ours_b = engine_logits(directory, a, b)
    theirs_a, theirs_b = transformers_logits(directory, a, b)
    assert (ours_a - theirs_a).abs().max() < 1e-4
    assert (ours_b - theirs_b).abs().max() < 1e-4


def test_the_sliding_window_changes_the_logits_of_positions_past_it(tiny_model_dir, tmp_path):
    """What makes the comparison above a test of the window: without it, the logits differ."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("gemma3"))
    model.config.sliding_window = 10_000
    model.save_pretrained(tmp_path)
    a, b = token_sequences(vocab_size=256)
    windowed_a, _ = transformers_logits(tiny_model_dir("gemma3"), a, b)
    global_a, _ = transformers_logits(tmp_path, a, b)
    assert torch.equal(windowed_a[:TINY_SLIDING_WINDOW], global_a[:TINY_SLIDING_WINDOW])
    assert (windowed_a[TINY_SLIDING_WINDOW:] - global_a[TINY_SLIDING_WINDOW:]).abs().max() > 1e-2


def test_native_kernels_give_the_pytorch_path_results_in_bfloat16(tiny_model_dir, monkeypatch):
    """Gemma's q/k norms feed the native rotary + cache write (kernels/rotary_store.py)."""
    directory = tiny_model_dir("gemma3")
    a, b = token_sequences(vocab_size=256)
    with_prefill_kernel = engine_logits(directory, a, b, dtype="bfloat16")
    # NOTE: prefill attention on PyTorch's path too, so that the rest is compared bit for bit:
    # the native prefill kernel (where this CPU prefers it) agrees to bf16 rounding only.
    monkeypatch.setattr(paged_prefill_attention, "is_preferred", lambda dtype: False)
    native = engine_logits(directory, a, b, dtype="bfloat16")
    pytorch = engine_logits(directory, a, b, dtype="bfloat16", native_kernels=False)
    assert torch.equal(native[0], pytorch[0]) and torch.equal(native[1], pytorch[1])
    for ours, theirs in zip(with_prefill_kernel, pytorch, strict=True):
        assert torch.allclose(ours, theirs, atol=0.05, rtol=0.02)
