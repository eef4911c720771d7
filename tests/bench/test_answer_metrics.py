"""bench.answer_metrics: SQuAD's normalisation and scores, on hand-made answers."""

from __future__ import annotations

import pytest

from bench.answer_metrics import (
    answer_contained,
    exact_match,
    normalize_answer,
    score_answer,
    token_f1,
)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The  Denver Broncos!", "denver broncos"),
        ("an apple a day", "apple day"),
        ("A", ""),
        # Articles are whole words only; "the" inside a word stays.
        ("Theatre of the Absurd", "theatre of absurd"),
        # ASCII punctuation goes without leaving a space, as in the official script.
        ("Wesel-Datteln Canal", "weseldatteln canal"),
        ("U.S. (1962)", "us 1962"),
        ("\tline\nbreaks  and   tabs ", "line breaks and tabs"),
        # Non-ASCII punctuation is not in string.punctuation: the official script keeps it.
        ("24\u201310", "24\u201310"),  # an en dash
    ],
)
def test_normalisation_lowercases_and_strips_punctuation_articles_and_spaces(
    text: str, normalized: str
) -> None:
    assert normalize_answer(text) == normalized


def test_exact_match_ignores_case_punctuation_and_articles() -> None:
    assert exact_match("the Denver Broncos.", "Denver Broncos") == 1.0
    assert exact_match("Denver", "Denver Broncos") == 0.0


def test_token_f1_is_the_harmonic_mean_of_token_precision_and_recall() -> None:
    # precision 2/3, recall 1
    assert token_f1("Denver Broncos won", "Denver Broncos") == pytest.approx(0.8)
    assert token_f1("Broncos", "the Denver Broncos") == pytest.approx(2 / 3)
    assert token_f1("Carolina Panthers", "Denver Broncos") == 0.0


def test_token_f1_counts_repeated_tokens_only_as_often_as_the_reference_has_them() -> None:
    # common tokens: one "cat", one "dog" -> precision 2/3, recall 2/3
    assert token_f1("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)


@pytest.mark.parametrize("prediction", ["", "   ", "The.", "a, an, the!"])
def test_an_answer_that_normalises_to_nothing_scores_zero(prediction: str) -> None:
    assert token_f1(prediction, "Denver Broncos") == 0.0
    assert exact_match(prediction, "Denver Broncos") == 0.0
    assert answer_contained(prediction, "Denver Broncos") == 0.0


def test_contained_finds_the_reference_as_whole_words_inside_a_sentence() -> None:
    assert answer_contained("The game was played in 1962, in Miami.", "1962") == 1.0
    assert answer_contained("It was the Denver Broncos' year", "Denver Broncos") == 1.0
    assert answer_contained("In 1962.", "9") == 0.0
    assert answer_contained("Broncos of Denver", "Denver Broncos") == 0.0
    assert answer_contained("anything", "The") == 0.0  # a reference of articles only


def test_each_score_is_its_best_over_the_reference_answers() -> None:
    score = score_answer("Project Apollo program", ["Apollo", "Project Apollo", "Mercury"])
    # "Project Apollo": precision 2/3, recall 1 beats "Apollo": precision 1/3, recall 1.
    assert score.f1 == pytest.approx(0.8)
    assert score.exact_match == 0.0
    assert score.contained == 1.0
    exact = score_answer("mercury", ["Apollo", "Project Apollo", "Mercury"])
    assert (exact.exact_match, exact.f1, exact.contained) == (1.0, 1.0, 1.0)


def test_an_answer_without_references_cannot_be_scored() -> None:
    with pytest.raises(ValueError, match="at least one reference"):
        score_answer("Denver", [])
