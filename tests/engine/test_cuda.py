"""The engine on a CUDA device (`device="cuda"`, `CACHET_DEVICE`): where PyTorch sees one.

Without a CUDA device these skip; on a GPU machine they run the real bundled model on it and
check its greedy answer against the CPU's in float32.
"""

from __future__ import annotations

import pytest
import torch

from inference.engine import Engine, EngineConfig, SamplingParams
from tests.engine.real_model import chat

pytestmark = [
    pytest.mark.real_weights,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA device"),
]


def greedy_answer(model_dir, prompt: list[int], device: str) -> list[int]:
    config = EngineConfig(model_dir, device=device, dtype="float32", kv_cache_mb=64)
    with Engine(config) as engine:
        params = SamplingParams(temperature=0, max_tokens=12)
        return engine.generate([prompt], params)[0].token_ids


def test_the_engine_on_cuda_answers_as_on_the_cpu(chat_model_dir, real_tokenizer) -> None:
    prompt = chat(real_tokenizer, "Name three rivers of Europe and the seas they flow into.")
    on_cuda = greedy_answer(chat_model_dir, prompt, "cuda")
    assert len(on_cuda) == 12
    assert on_cuda[:4] == greedy_answer(chat_model_dir, prompt, "cpu")[:4]
