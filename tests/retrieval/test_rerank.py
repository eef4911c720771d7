"""retrieval.rerank: the pluggable rerankers, including a real CrossEncoder loaded by directory."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from retrieval.rerank import (
    Candidate,
    CrossEncoderReranker,
    NoReranker,
    ScoreFusionReranker,
    make_reranker,
)


def candidates() -> list[Candidate]:
    return [
        Candidate(1, "alpha", 0.30, lexical_score=10.0, dense_score=0.20),
        Candidate(2, "beta", 0.20, lexical_score=None, dense_score=0.80),
        Candidate(3, "gamma", 0.10, lexical_score=2.0, dense_score=0.50),
    ]


def test_none_keeps_the_fusion_order() -> None:
    assert [c.chunk_id for c in NoReranker().rerank("q", candidates())] == [1, 2, 3]


def test_score_fusion_reorders_by_weighted_normalised_scores() -> None:
    # lexical normalised: 1 -> 1, 3 -> 0; dense normalised: 2 -> 1, 3 -> 0.5, 1 -> 0.
    reranked = ScoreFusionReranker(lexical_weight=0.3).rerank("q", candidates())
    assert [(c.chunk_id, round(c.score, 3)) for c in reranked] == [(2, 0.7), (3, 0.35), (1, 0.3)]
    reranked = ScoreFusionReranker(lexical_weight=0.8).rerank("q", candidates())
    assert [c.chunk_id for c in reranked] == [1, 2, 3]


def test_a_lexical_weight_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="lexical_weight"):
        ScoreFusionReranker(1.5)


@pytest.fixture(scope="module")
def tiny_cross_encoder_dir(tmp_path_factory, embedding_model_dir):
    """A 1-layer randomly initialised BERT with one output, saved as a CrossEncoder directory."""
    directory = tmp_path_factory.mktemp("tiny-cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(str(embedding_model_dir))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_a_cross_encoder_given_by_directory_scores_and_sorts_every_candidate(
    tiny_cross_encoder_dir,
) -> None:
    reranker = make_reranker(f"cross-encoder:{tiny_cross_encoder_dir}")
    assert isinstance(reranker, CrossEncoderReranker)
    assert reranker.name == f"cross-encoder:{tiny_cross_encoder_dir}"
    reranked = reranker.rerank("which letter?", candidates())
    assert sorted(c.chunk_id for c in reranked) == [1, 2, 3]
    scores = [c.score for c in reranked]
    assert scores == sorted(scores, reverse=True)
    direct = reranker.model.predict([("which letter?", "beta")])
    assert next(c.score for c in reranked if c.chunk_id == 2) == pytest.approx(float(direct[0]))
    assert reranker.rerank("q", []) == []


@pytest.mark.parametrize("spec", ["magic", "cross-encoder:", "cross-encoder:  "])
def test_an_unknown_reranker_setting_is_refused_with_the_choices(spec: str) -> None:
    with pytest.raises(ValueError, match="expected none, fusion or cross-encoder"):
        make_reranker(spec)
