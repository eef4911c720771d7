"""bench.perplexity: chunked prefill through the paged cache scores like one forward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bench.perplexity import perplexity
from inference.engine import EngineConfig, ModelRunner


def make_runner(directory, num_blocks: int = 16) -> ModelRunner:
    # tiny models: 2 layers x 2 KV heads x 16 dims x 2 (K and V) x 4 bytes = 512 B/token
    config = EngineConfig(
        directory,
        dtype=torch.float32,
        kv_cache_mb=num_blocks * 16 * 512 / 2**20,
        block_size=16,
        max_model_len=256,
    )
    return ModelRunner(config)


def reference_perplexity(directory, token_ids: list[int], window: int) -> float:
    """transformers' own forward over each window at once (no cache, no chunks)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(token_ids) - 1, window):
            ids = torch.tensor([token_ids[start : start + window]])
            if ids.shape[1] < 2:
                continue
            logits = model(ids).logits[0, :-1].float()
            total += F.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
            count += ids.shape[1] - 1
    return math.exp(total / count)


def test_chunked_windows_give_the_perplexity_of_a_plain_forward(tiny_model_dir):
    directory = tiny_model_dir("qwen2")
    generator = torch.Generator().manual_seed(1)
    token_ids = torch.randint(0, 256, (150,), generator=generator).tolist()
    measured = perplexity(make_runner(directory), token_ids, window=64, chunk=24)
    assert measured == pytest.approx(reference_perplexity(directory, token_ids, 64), rel=1e-4)


def test_a_window_larger_than_the_kv_cache_is_refused(tiny_model_dir):
    runner = make_runner(tiny_model_dir("qwen2"), num_blocks=16)
    with pytest.raises(ValueError, match="needs 32 KV blocks"):
        perplexity(runner, list(range(10)), window=512)


def test_fewer_than_two_tokens_cannot_be_scored(tiny_model_dir):
    with pytest.raises(ValueError, match="at least two tokens"):
        perplexity(make_runner(tiny_model_dir("qwen2")), [5])
