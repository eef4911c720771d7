"""Prepare the configured models once (fetch, convert, locate) and prove that they load."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from inference.model_files import ResolvedModel, resolve_chat_model, resolve_embedding_model

logger = logging.getLogger(__name__)

PROBE_TEXT = "Cachet answers from your own documents."
PROBE_TOKENS = 4
PROBE_MAX_MODEL_LEN = 128


@dataclass(frozen=True, slots=True)
class PreparedModel:
    role: str  # "chat" or "embedding"
    resolved: ResolvedModel
    seconds: float
    check: str  # what the load check saw

    def describe(self) -> str:
        return (
            f"{self.role} model ({self.resolved.source}): {self.resolved.action} at "
            f"{self.resolved.directory} in {self.seconds:.1f}s; {self.check}"
        )


def prepare_models(
    chat_sources: Sequence[str],
    embedding_source: str | None,
    models_dir: Path,
    *,
    model_cache: Path | None = None,
) -> list[PreparedModel]:
    """Resolve (fetching and converting where needed) each chat model and the embedding model,
    and load each once to verify it."""
    prepared = [
        _timed(
            "chat",
            lambda source=source: resolve_chat_model(source, models_dir, model_cache=model_cache),
            verify_chat_model,
        )
        for source in chat_sources
    ]
    prepared.append(
        _timed("embedding", lambda: resolve_embedding_model(embedding_source), verify_embedder)
    )
    return prepared


def _timed(role, resolve, verify) -> PreparedModel:
    started = time.perf_counter()
    resolved = resolve()
    check = verify(resolved.directory)
    return PreparedModel(role, resolved, time.perf_counter() - started, check)


def verify_chat_model(directory: Path) -> str:
    """Load the model as the engine serves it and generate a few tokens greedily.

    NOTE: through the engine's own loader, not transformers: that is what will serve it (a GGUF
    stays quantized: the 1.5B default takes ~1.2 GB here, where transformers would dequantize it
    to 6 GB of float32), and a checkpoint it refuses is refused now, with its reason.
    """
    from inference.engine import Engine, EngineConfig, SamplingParams

    config = EngineConfig(
        model_dir=directory, max_model_len=PROBE_MAX_MODEL_LEN, kv_cache_mb=16, max_num_seqs=1
    )
    engine = Engine(config)
    try:
        [result] = engine.generate(
            [PROBE_TEXT], SamplingParams(temperature=0, max_tokens=PROBE_TOKENS, ignore_eos=True)
        )
        runner = engine.runner
    finally:
        engine.shutdown()
    if result.usage.completion_tokens != PROBE_TOKENS:
        raise RuntimeError(
            f"the chat model at {directory} generated {result.usage.completion_tokens} tokens "
            f"of {PROBE_TOKENS} ({result.finish_reason})"
        )
    loaded = f"loaded {runner.load_report.describe()}; " if runner is not None else ""
    return f"{loaded}generated {PROBE_TOKENS} tokens: {result.text!r}"


def verify_embedder(directory: Path) -> str:
    """Load the embedding model as search does and embed one sentence."""
    import numpy as np

    from retrieval.embeddings import load_embedder

    vector = load_embedder(str(directory)).encode([PROBE_TEXT])[0]
    if not np.isfinite(vector).all() or abs(float(np.linalg.norm(vector)) - 1.0) > 1e-3:
        raise RuntimeError(f"the embedding model at {directory} produced a bad vector")
    return f"embedding dimension {vector.shape[0]}"
