"""evals.answer_metrics: SQuAD's normalisation and scores, on hand-made answers."""

from __future__ import annotations

import pytest

from evals.answer_metrics import (
    answer_contained,
    chinese_tokens,
    cjk_share,
    exact_match,
    is_chinese,
    normalize_answer,
    score_answer,
    score_chinese_answer,
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


@pytest.mark.parametrize(
    ("text", "share"),
    [
        ("登录名和密码", 1.0),
        ("The login name and the password.", 0.0),
        # A Latin word weighs as one Han character, a path is one word: an answer naming them stays
        # Chinese.
        ("配置文件是 /etc/network/interfaces。", 5 / 6),
        ("在 Debian 上 /bin/sh 实际指向 /usr/bin/dash。", 6 / 9),
        ("Run 安装 now", 2 / 4),
        ("[1] 42", 0.0),
        ("", 0.0),
    ],
)
def test_the_chinese_share_counts_han_characters_against_latin_words(text, share):
    assert cjk_share(text) == pytest.approx(share)
    assert is_chinese(text) == (share > 0.5)


def test_chinese_is_scored_by_character_and_embedded_english_by_word():
    # NFKC folds full-width letters; punctuation and spaces go.
    text = "在 /etc/motd 文件里。\uff21\uff30\uff34"  # full-width "APT"
    assert chinese_tokens(text) == ["在", "etc", "motd", "文", "件", "里", "apt"]
    assert chinese_tokens("“,” …") == []


def test_a_chinese_answer_scores_character_f1_and_recall_best_over_references():
    score = score_chinese_answer("它在 /etc/motd 里", ["/etc/motd", "欢迎信息"])
    # 2 of the answer's 5 units are the reference's 2: precision 0.4, recall 1
    assert score.f1 == pytest.approx(2 * 0.4 / 1.4) and score.recall == 1.0
    assert score_chinese_answer("不需要", ["不需要按住 Shift"]).recall == 3 / 6
    assert score_chinese_answer("No idea.", ["欢迎信息"]).f1 == 0.0
    with pytest.raises(ValueError, match="at least one reference"):
        score_chinese_answer("答案", [])
