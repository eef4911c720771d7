"""The Llama family (Llama, Mistral, Qwen2, Qwen3): config parsing, and logits against
transformers' own models through the runner and the paged KV cache."""

from __future__ import annotations

import pytest
import torch

from inference.engine.kernels import paged_prefill_attention
from inference.engine.models.llama import LlamaArgs
from tests.engine.models.paged_schedule import engine_logits, token_sequences, transformers_logits
from tests.tiny_models import TINY_SLIDING_WINDOW

# NOTE: tiny models: one thread is as fast, and does not stall when a neighbour holds a core.
pytestmark = pytest.mark.usefixtures("torch_threads_on_free_cores")


def test_qwen2_gets_q_k_v_biases_but_no_output_bias():
    from transformers import Qwen2Config

    args = LlamaArgs.from_hf_config(Qwen2Config())
    assert (args.qkv_bias, args.o_bias, args.qk_norm) == (True, False, False)


def test_qwen3_gets_per_head_q_k_norms_its_own_head_dim_and_no_biases():
    from transformers import Qwen3Config

    args = LlamaArgs.from_hf_config(
        Qwen3Config(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8)
    )
    assert (args.qk_norm, args.qkv_bias, args.o_bias) == (True, False, False)
    assert args.head_dim == 128  # not 1024 / 16
    assert args.distinct_sliding_windows == ()


def test_mistral_sliding_window_applies_to_every_layer_without_capping_the_length():
    from transformers import MistralConfig

    args = LlamaArgs.from_hf_config(
        MistralConfig(num_hidden_layers=3, max_position_embeddings=32768, sliding_window=4096)
    )
    assert args.sliding_windows == (4096, 4096, 4096)
    assert args.max_position_embeddings == 32768


def test_qwen2_slides_only_from_max_window_layers_on_and_only_when_use_sliding_window():
    from transformers import Qwen2Config

    config = Qwen2Config(
        num_hidden_layers=4, use_sliding_window=True, sliding_window=512, max_window_layers=2
    )
    assert LlamaArgs.from_hf_config(config).sliding_windows == (None, None, 512, 512)
    off = Qwen2Config(num_hidden_layers=4, use_sliding_window=False, sliding_window=512)
    assert LlamaArgs.from_hf_config(off).sliding_windows == (None,) * 4


@pytest.mark.parametrize(
    "kind", ["llama", "qwen2", "mistral", "mistral-window", "qwen2-window", "qwen3"]
)
def test_logits_match_transformers_through_chunked_prefill_a_prefix_hit_and_decodes(
    tiny_model_dir, kind
):
    directory = tiny_model_dir(kind)
    a, b = token_sequences(vocab_size=256)
    ours_a, ours_b = engine_logits(directory, a, b)
    theirs_a, theirs_b = transformers_logits(directory, a, b)
    assert (ours_a - theirs_a).abs().max() < 1e-4
    assert (ours_b - theirs_b).abs().max() < 1e-4


@pytest.mark.parametrize("kind", ["mistral-window", "qwen2-window"])
def test_the_sliding_window_changes_the_logits_of_positions_past_it(tiny_model_dir, tmp_path, kind):
    """What makes the comparison above a test of the window: without it, the logits differ."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(kind))
    model.config.sliding_window = None
    if kind == "qwen2-window":
        model.config.layer_types = ["full_attention"] * model.config.num_hidden_layers
    model.save_pretrained(tmp_path)
    a, b = token_sequences(vocab_size=256)
    windowed_a, _ = transformers_logits(tiny_model_dir(kind), a, b)
    global_a, _ = transformers_logits(tmp_path, a, b)
    assert torch.equal(windowed_a[:TINY_SLIDING_WINDOW], global_a[:TINY_SLIDING_WINDOW])
    assert (windowed_a[TINY_SLIDING_WINDOW:] - global_a[TINY_SLIDING_WINDOW:]).abs().max() > 1e-2


def test_qwen3_native_kernels_give_the_pytorch_path_results_in_bfloat16(
    tiny_model_dir, monkeypatch
):
    """The q/k norms feed the native rotary + cache write (kernels/rotary_store.py)."""
    directory = tiny_model_dir("qwen3")
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
