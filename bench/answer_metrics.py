"""How close an answer is to SQuAD's reference answers: exact match, token F1, "contained".

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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

ARTICLES = re.compile(r"\b(a|an|the)\b")
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
    predicted = normalize_answer(prediction).split()
    expected = normalize_answer(reference).split()
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
