"""How close an answer is to SQuAD's reference answers: exact match, token F1, "contained"; to a
Chinese reference: character F1 and recall; and which language an answer is written in.

The normalisation is the official SQuAD v1.1 evaluation script's (lowercase, drop ASCII
punctuation, drop the articles a/an/the, collapse whitespace) and every score is the best over
a question's reference answers, as the official script takes it, so the figures compare with
published ones. "Contained" is ours: a chat model that answers in a sentence ("The game was
played on February 7, 2016.") scores a low F1 although the answer is right there; it counts an
answer whose normalised text holds a normalised reference as whole words.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

ARTICLES = re.compile(r"\b(a|an|the)\b")
# CJK Unified Ideographs and Extension A: the Han characters of Chinese.
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
# A Latin word, with what joins it into one name: "sources.list", "apt-get", "/usr/bin/dash".
LATIN_WORD = re.compile(r"[A-Za-z0-9_]*[A-Za-z][A-Za-z0-9_]*(?:[./-][A-Za-z0-9_]+)*")
# Chinese scoring units: each Han character, and each run of Latin letters and digits.
MIXED_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]|[a-z0-9]+")
PUNCTUATION = frozenset(string.punctuation)


@dataclass(frozen=True, slots=True)
class AnswerScore:
    """One answer's scores against its question's references (each in [0, 1])."""

    exact_match: float
    f1: float
    contained: float


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation, in the official script's order."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """The harmonic mean of token precision and recall (tokens counted with repeats).

    NOTE: as in the official v1.1 script, an answer that normalises to nothing scores 0.
    """
    return _bag_f1(normalize_answer(prediction).split(), normalize_answer(reference).split())


def _bag_f1(predicted: Sequence[str], expected: Sequence[str]) -> float:
    num_common = sum((Counter(predicted) & Counter(expected)).values())
    if num_common == 0:
        return 0.0
    precision = num_common / len(predicted)
    recall = num_common / len(expected)
    return 2 * precision * recall / (precision + recall)


def answer_contained(prediction: str, reference: str) -> float:
    """Whether the normalised reference occurs in the normalised prediction as whole words.

    NOTE: whole words, so a reference "9" is not found inside "1962"; an empty reference is
    never contained.
    """
    expected = normalize_answer(reference)
    return float(bool(expected) and f" {expected} " in f" {normalize_answer(prediction)} ")


def score_answer(prediction: str, references: Sequence[str]) -> AnswerScore:
    """Each score's best over `references` (a question may have several accepted answers)."""
    if not references:
        raise ValueError("a question needs at least one reference answer to be scored")
    return AnswerScore(
        exact_match=max(exact_match(prediction, r) for r in references),
        f1=max(token_f1(prediction, r) for r in references),
        contained=max(answer_contained(prediction, r) for r in references),
    )


def cjk_share(text: str) -> float:
    """The share of Chinese in `text`: Han characters among Han characters plus Latin words.

    NOTE: a Latin *word* weighs as much as one Han character (each is about one unit of
    meaning), and a path or dotted name is one word, so a Chinese answer that names
    `/usr/bin/dash` stays Chinese; counting letters would call it English. Text with neither
    scores 0.
    """
    num_han = len(HAN.findall(text))
    num_words = len(LATIN_WORD.findall(text))
    return num_han / (num_han + num_words) if num_han + num_words else 0.0


def is_chinese(text: str) -> bool:
    """Whether `text` is mostly Chinese (`cjk_share` above one half)."""
    return cjk_share(text) > 0.5


@dataclass(frozen=True, slots=True)
class ChineseScore:
    """One answer against Chinese references: character F1 and recall (each in [0, 1])."""

    f1: float
    recall: float  # the share of the reference's characters the answer holds


def chinese_tokens(text: str) -> list[str]:
    """Scoring units of Chinese text: every Han character alone, every Latin or digit run whole.

    SQuAD splits on whitespace, which Chinese does not have: a whole sentence would be one
    token. As in CMRC 2018's and DRCD's evaluation, Chinese is scored character by character
    and embedded English (commands, paths) word by word; NFKC folds full-width letters and
    digits, case is ignored, punctuation and spaces are dropped.
    """
    return MIXED_TOKEN.findall(unicodedata.normalize("NFKC", text).lower())


def score_chinese_answer(prediction: str, references: Sequence[str]) -> ChineseScore:
    """Character F1 and recall, each the best over `references`."""
    if not references:
        raise ValueError("a question needs at least one reference answer to be scored")
    predicted = chinese_tokens(prediction)
    expected = [chinese_tokens(reference) for reference in references]
    return ChineseScore(
        f1=max(_bag_f1(predicted, tokens) for tokens in expected),
        recall=max(_bag_recall(predicted, tokens) for tokens in expected),
    )


def _bag_recall(predicted: Sequence[str], expected: Sequence[str]) -> float:
    if not expected:
        return 0.0
    return sum((Counter(predicted) & Counter(expected)).values()) / len(expected)
