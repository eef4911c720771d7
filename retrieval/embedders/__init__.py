"""Embedding models that sentence-transformers cannot load, behind the `Embedder` interface.

Each embedder has `encode(texts, kind)` (float32 unit rows), `dimension`, `batch_size` and a
Hugging Face style `tokenizer` (what `retrieval.chunking` counts tokens with). `kind` says whether
the texts are search queries or indexed passages: asymmetric retrieval models such as e5 are
trained with a different prefix for each, and a query embedded as a passage (or the reverse)
loses recall.

The weights come from registry packages that ship them as plain files (no hub download at run
time); the packages are located through their distribution metadata and never imported, since
their own Python code needs things we do not install (a compiled engine for another Python).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import numpy as np

EmbedKind = Literal["query", "passage"]


class TextEmbedder(Protocol):
    """What search, ingestion and the embeddings API use of an embedding model."""

    dimension: int
    batch_size: int
    model_id: str  # what the vector index records: vectors of two models never mix

    @property
    def tokenizer(self) -> Any: ...  # called as tokenizer(texts, **kwargs) -> Mapping

    def encode(self, texts: list[str], kind: EmbedKind = "passage") -> np.ndarray: ...


__all__ = ["EmbedKind", "TextEmbedder"]
