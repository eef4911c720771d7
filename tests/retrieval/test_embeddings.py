"""retrieval.embeddings: the real sentence-transformers model, batched and normalised."""

from __future__ import annotations

import numpy as np

from retrieval.embeddings import Embedder, get_embedder


def test_vectors_are_float32_unit_rows_one_per_text() -> None:
    embedder = get_embedder()
    vectors = embedder.encode(["first text", "second text", "third"])
    assert vectors.shape == (3, embedder.dimension) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_related_texts_are_closer_than_unrelated_ones() -> None:
    holiday, leave, kitchen = get_embedder().encode(
        ["paid holiday days", "annual leave allowance", "the kitchen sink is blocked"]
    )
    assert holiday @ leave > holiday @ kitchen


def test_batching_does_not_change_the_vectors(embedding_model_dir) -> None:
    texts = [f"sentence number {i} about topic {i % 3}" for i in range(7)]
    small = Embedder(str(embedding_model_dir), batch_size=2)
    assert np.allclose(small.encode(texts), get_embedder().encode(texts), atol=1e-5)
    assert small.encode([]).shape == (0, small.dimension)


def test_the_model_is_loaded_once_per_source() -> None:
    assert get_embedder() is get_embedder()
