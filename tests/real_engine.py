"""Real-model helpers for engine tests: a float32 runner, and a runner view with fewer blocks."""

from __future__ import annotations

from pathlib import Path

import torch


def float32_runner(model_dir: Path, *, kv_cache_mb: int, max_model_len: int):
    """The real model in float32 (exact equality holds), 16-token blocks."""
    from inference.engine.model_runner import ModelRunner

    return ModelRunner(
        model_dir,
        dtype=torch.float32,
        kv_cache_bytes=kv_cache_mb * 2**20,
        block_size=16,
        max_model_len=max_model_len,
    )


class SmallCache:
    """The real runner, but the engine may only use its first `num_kv_blocks` blocks."""

    def __init__(self, runner, num_kv_blocks: int):
        self.runner = runner
        self.num_kv_blocks = num_kv_blocks

    def __getattr__(self, name):
        return getattr(self.runner, name)
