"""Prepare the configured models once (convert, locate) and prove that they load."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from inference.model_files import ResolvedModel, resolve_chat_model, resolve_embedding_model

logger = logging.getLogger(__name__)

PROBE_TEXT = "Cachet answers from your own documents."


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
    chat_source: str | None, embedding_source: str | None, models_dir: Path
) -> list[PreparedModel]:
    """Resolve (converting where needed) both models and load each once to verify it."""
    return [
        _timed("chat", lambda: resolve_chat_model(chat_source, models_dir), verify_chat_model),
        _timed("embedding", lambda: resolve_embedding_model(embedding_source), verify_embedder),
    ]


def _timed(role, resolve, verify) -> PreparedModel:
    started = time.perf_counter()
    resolved = resolve()
    check = verify(resolved.directory)
    return PreparedModel(role, resolved, time.perf_counter() - started, check)


def verify_chat_model(directory: Path) -> str:
    """Load tokenizer and weights, run one forward pass, and check the logits are finite."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    input_ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = model(input_ids).logits
    if not torch.isfinite(logits).all():
        raise RuntimeError(f"the chat model at {directory} produced non-finite logits")
    num_params = sum(p.numel() for p in model.parameters())
    return (
        f"loaded {num_params / 1e6:.0f}M parameters, forward pass on {input_ids.shape[1]} tokens ok"
    )


def verify_embedder(directory: Path) -> str:
    """Load the sentence-transformers model and embed one sentence."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(directory), device="cpu")
    vector = model.encode([PROBE_TEXT], normalize_embeddings=True)[0]
    if not np.isfinite(vector).all() or abs(float(np.linalg.norm(vector)) - 1.0) > 1e-3:
        raise RuntimeError(f"the embedding model at {directory} produced a bad vector")
    return f"embedding dimension {vector.shape[0]}"
