"""Sentence-transformers embeddings: one model per process, batched, L2-normalised."""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from inference.torch_threads import run_torch_work

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)
_lock = threading.Lock()


class Embedder:
    def __init__(self, source: str | None, *, batch_size: int = 64, bf16: bool = False) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        from inference.model_files import resolve_embedding_model

        directory = resolve_embedding_model(source).directory
        self.model = SentenceTransformer(str(directory), device="cpu")
        # NOTE: off by default: measured on this 2-core machine bf16 embeds at 2.7 passages/s
        # against 16 in fp32 (no fast bf16 kernels here); turn on where AMX is present.
        if bf16:
            self.model = self.model.to(torch.bfloat16)
        self.batch_size = batch_size
        dimension = self.model.get_embedding_dimension()
        if dimension is None:
            raise ValueError(f"the embedding model in {directory} does not say its dimension")
        self.dimension = int(dimension)
        self.tokenizer = self.model.tokenizer
        logger.info("embedding model %s loaded (dim %d)", directory, self.dimension)

    def encode(self, texts: list[str]) -> np.ndarray:
        """Float32 unit vectors, one row per text."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)

        def embed() -> torch.Tensor:
            return self.model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=False,
                convert_to_tensor=True,
                show_progress_bar=False,
            )

        with _lock:  # NOTE: the model is not safe to call from two threads at once.
            # NOTE: queries single-threaded, batches on a short-lived thread: either way no
            # lasting OpenMP team competes with the engine's (see inference/torch_threads.py).
            # Batches are ingestion's bulk work: niced, so chats keep the cores.
            vectors = run_torch_work(embed, len(texts), background=True)
        unit_vectors: np.ndarray = vectors.float().cpu().numpy().astype(np.float32, copy=False)
        return unit_vectors


@lru_cache(maxsize=4)
def get_embedder(source: str | None = None) -> Embedder:
    from django.conf import settings

    return Embedder(source if source is not None else settings.CACHET_EMBEDDING_MODEL)
