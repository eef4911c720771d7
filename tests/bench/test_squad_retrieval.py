"""bench.squad_retrieval: which passages the end-to-end index holds (the search itself runs in
tests/bench/test_answer_quality.py's smoke run)."""

from __future__ import annotations

import pytest

from bench.squad_questions import DEFAULT_SQUAD_DIR, load_passages, load_questions
from bench.squad_retrieval import passages_to_index

pytestmark = pytest.mark.skipif(
    not DEFAULT_SQUAD_DIR.is_dir(), reason=f"the squad-dev set is not at {DEFAULT_SQUAD_DIR}"
)


def test_a_small_index_holds_the_first_passages_and_every_gold_passage_once() -> None:
    questions = load_questions(limit=5)
    corpus = load_passages()
    chosen = passages_to_index(questions, corpus, 40)
    ids = [passage.passage_id for passage in chosen]
    assert ids[:40] == [passage.passage_id for passage in corpus[:40]]
    assert len(ids) == len(set(ids))
    # p0_33 (question 3's gold passage) is among the first 40: not added twice.
    assert ids[40:] == ["p47_31", "p1_34", "p35_7", "p22_0"]


def test_no_limit_indexes_the_whole_corpus() -> None:
    corpus = load_passages()
    assert passages_to_index(load_questions(limit=5), corpus, None) == corpus
