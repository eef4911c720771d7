"""retrieval.embeddings: the real sentence-transformers model, batched and normalised."""

from __future__ import annotations

import json
import shutil

import numpy as np

from retrieval.embedders.multilingual_e5 import MultilingualE5Embedder
from retrieval.embeddings import Embedder, get_embedder, load_embedder


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
    assert np.allclose(
        small.encode(texts), Embedder(str(embedding_model_dir)).encode(texts), atol=1e-5
    )
    assert small.encode([]).shape == (0, small.dimension)


def test_the_model_is_loaded_once_per_source() -> None:
    assert get_embedder() is get_embedder()


def test_the_configured_model_is_the_one_loaded(settings) -> None:
    settings.CACHET_EMBEDDING_MODEL = "multilingual-e5-small"
    embedder = get_embedder()
    assert isinstance(embedder, MultilingualE5Embedder)
    assert embedder.model_id == "multilingual-e5-small"
    settings.CACHET_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
    assert get_embedder().model_id == "all-MiniLM-L6-v2"


def test_a_sentence_transformers_model_with_query_and_passage_prompts_gets_them(
    embedding_model_dir, tmp_path
) -> None:
    prompted = tmp_path / "prompted"
    shutil.copytree(embedding_model_dir, prompted)
    config_path = prompted / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text())
    config["prompts"] = {"query": "query: ", "passage": "passage: "}
    config_path.write_text(json.dumps(config))
    model = load_embedder(str(prompted))
    plain = Embedder(str(embedding_model_dir))
    [query] = model.encode(["paid holiday"], kind="query")
    [passage] = model.encode(["paid holiday"], kind="passage")
    assert np.allclose(query, plain.encode(["query: paid holiday"])[0], atol=1e-5)
    assert np.allclose(passage, plain.encode(["passage: paid holiday"])[0], atol=1e-5)
    assert not np.allclose(query, passage, atol=1e-3)
