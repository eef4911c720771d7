"""Embedding models: one per process, batched, L2-normalised, behind one interface.

`get_embedder()` loads the configured model (`CACHET_EMBEDDING_MODEL`): a sentence-transformers
directory or hub id (`Embedder`), or a multilingual-e5 E5S1 file (`MultilingualE5Embedder`).
Every embedder says what it is (`model_id`), which the vector index records so that vectors of two
models never mix (retrieval.index).
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from inference.torch_threads import run_torch_work
from retrieval.embedders import EmbedKind, TextEmbedder

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)
_lock = threading.Lock()


class Embedder:
    """A sentence-transformers model. Its `prompts` (config_sentence_transformers.json), when it
    names "query" and "passage" ones, are applied by `kind`; without them both kinds embed alike."""

    def __init__(
        self,
        source: str | None,
        *,
        batch_size: int = 64,
        bf16: bool = False,
        model_id: str | None = None,
    ) -> None:
        """`model_id`: what the vector index records (default: the resolved source's name)."""
        import torch
        from sentence_transformers import SentenceTransformer

        from inference.model_files import resolve_embedding_model

        resolved = resolve_embedding_model(source)
        directory = resolved.directory
        self.model_id = model_id or resolved.source
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

    def encode(self, texts: list[str], kind: EmbedKind = "passage") -> np.ndarray:
        """Float32 unit vectors, one row per text; `kind`: search queries or indexed passages."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        prompt_name = kind if kind in (self.model.prompts or {}) else None

        def embed() -> torch.Tensor:
            return self.model.encode(
                texts,
                prompt_name=prompt_name,
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


def load_embedder(source: str | None) -> TextEmbedder:
    """The embedding model `source` names (see `inference.model_files.resolve_embedding_model`),
    loaded by the reader its format needs."""
    from inference.model_files import holds_e5s1_weights, resolve_embedding_model

    resolved = resolve_embedding_model(source)
    if holds_e5s1_weights(resolved.directory):
        from retrieval.embedders.multilingual_e5 import MultilingualE5Embedder

        return MultilingualE5Embedder(resolved.directory, model_id=resolved.source)
    # NOTE: the resolved directory, not `source`: a hub id is looked up once, not twice.
    return Embedder(str(resolved.directory), model_id=resolved.source)


def get_embedder(source: str | None = None) -> TextEmbedder:
    """The process's embedder of `source` (None: `settings.CACHET_EMBEDDING_MODEL`), loaded once."""
    from django.conf import settings

    return _loaded_embedder(source if source is not None else settings.CACHET_EMBEDDING_MODEL)


@lru_cache(maxsize=4)
def _loaded_embedder(source: str) -> TextEmbedder:
    return load_embedder(source)
