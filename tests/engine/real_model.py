"""Real-model helpers for engine tests: float32 and bfloat16 runners, and a runner view with
fewer blocks."""

from __future__ import annotations

from pathlib import Path

import torch


def float32_runner(model_dir: Path, *, kv_cache_mb: int, max_model_len: int):
    """The real model in float32 (exact equality holds), 16-token blocks."""
    return _runner(model_dir, torch.float32, kv_cache_mb, max_model_len)


def bfloat16_runner(
    model_dir: Path, *, kv_cache_mb: int, max_model_len: int, quantization: str = "none"
):
    """The real model in bfloat16 (the native CPU kernels' dtype), 16-token blocks."""
    return _runner(model_dir, torch.bfloat16, kv_cache_mb, max_model_len, quantization)


def native_dtype_runner(
    model_dir: Path,
    *,
    kv_cache_mb: int,
    max_model_len: int,
    quantization: str = "none",
    prefill_weights: str = "auto",
):
    """The real model in the dtype "auto" picks on this CPU (bf16 where bf16 arithmetic is
    native, float32 elsewhere): the dtype the native kernels serve here."""
    from inference.engine.config import resolve_auto_dtype

    return _runner(
        model_dir, resolve_auto_dtype(), kv_cache_mb, max_model_len, quantization, prefill_weights
    )


def dtype_runner(model_dir: Path, dtype: torch.dtype, *, kv_cache_mb: int, max_model_len: int):
    """The real model in `dtype` (float weights), 16-token blocks."""
    return _runner(model_dir, dtype, kv_cache_mb, max_model_len)


def _runner(
    model_dir: Path,
    dtype: torch.dtype,
    kv_cache_mb: int,
    max_model_len: int,
    quantization: str = "none",
    prefill_weights: str = "auto",
):
    from inference.engine import EngineConfig, ModelRunner

    # NOTE: float weights ("none") unless asked: the bundled model is a GGUF, which "auto" would
    # keep in int4.
    config = EngineConfig(
        model_dir,
        dtype=dtype,
        quantization=quantization,
        kv_cache_mb=kv_cache_mb,
        block_size=16,
        max_model_len=max_model_len,
        prefill_weights=prefill_weights,
    )
    return ModelRunner(config)


class SmallCache:
    """The real runner, but the engine may only use its first `num_kv_blocks` blocks."""

    def __init__(self, runner, num_kv_blocks: int):
        self.runner = runner
        self.num_kv_blocks = num_kv_blocks

    def __getattr__(self, name):
        return getattr(self.runner, name)


class RealEngines:
    """Engines on one shared float32 runner (a fixture's factory); `shutdown` stops them all."""

    def __init__(self, runner, tokenizer, model_dir: Path, max_model_len: int) -> None:
        self.runner, self.tokenizer = runner, tokenizer
        self.model_dir, self.max_model_len = model_dir, max_model_len
        self.engines: list = []

    def make(self, num_kv_blocks: int | None = None, **config):
        from inference.engine.config import EngineConfig
        from inference.engine.engine import Engine

        runner = self.runner if num_kv_blocks is None else SmallCache(self.runner, num_kv_blocks)
        settings = {
            "dtype": "float32",
            "quantization": "none",
            "max_model_len": self.max_model_len,
            "block_size": 16,
        }
        engine_config = EngineConfig(self.model_dir, **(settings | config))
        self.engines.append(Engine(engine_config, runner=runner, tokenizer=self.tokenizer))
        return self.engines[-1]

    def shutdown(self) -> None:
        for engine in self.engines:
            engine.shutdown()


def chat(tokenizer, question: str) -> list[int]:
    """The token ids of a one-question chat, ready for the answer."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
