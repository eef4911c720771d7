"""bench.squad_questions: the real squad-dev files, read as questions, passages and answers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.squad_questions import (
    DEFAULT_SQUAD_DIR,
    SquadDataError,
    load_passages,
    load_questions,
)

pytestmark = pytest.mark.skipif(
    not DEFAULT_SQUAD_DIR.is_dir(), reason=f"the squad-dev set is not at {DEFAULT_SQUAD_DIR}"
)


def first_lines(path: Path, count: int) -> list[dict]:
    with path.open() as handle:
        return [json.loads(next(handle)) for _ in range(count)]


def test_the_selection_is_the_head_of_queries_jsonl_in_file_order() -> None:
    questions = load_questions(limit=5)
    rows = first_lines(DEFAULT_SQUAD_DIR / "queries.jsonl", 5)
    assert [q.question_id for q in questions] == [row["_id"] for row in rows]
    assert [q.question for q in questions] == [row["text"] for row in rows]


def test_the_first_question_has_its_reference_answers_and_gold_passage() -> None:
    [first] = load_questions(limit=1)
    assert first.question == "How is the Pauli exclusion priciple manifested in the macro world?"
    assert first.answers == (
        "a structural force",
        "as a structural force",
        "macroscopically as a structural force",
    )
    assert (first.passage.passage_id, first.passage.title) == ("p47_31", "Force")


def test_every_question_has_an_answer_that_is_a_span_of_its_gold_passage() -> None:
    questions = load_questions()
    assert len(questions) == 1000
    assert len({q.question_id for q in questions}) == 1000
    for question in questions:
        assert question.answers, question.question_id
        # SQuAD's answers are marked in the passage: a wrong passage would not hold them.
        assert any(a in question.passage.text for a in question.answers), question.question_id


def test_passages_are_the_corpus_in_file_order_with_readable_titles() -> None:
    passages = load_passages()
    assert len(passages) == 2067
    assert (passages[0].passage_id, passages[0].title) == ("p0_0", "Super Bowl 50")
    assert passages[0].text.startswith("Super Bowl 50 was an American football game")


def copy_squad(tmp_path: Path) -> Path:
    directory = tmp_path / "squad-dev"
    shutil.copytree(DEFAULT_SQUAD_DIR, directory)
    for path in directory.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory


def test_a_directory_without_a_file_of_the_layout_is_refused_by_name(tmp_path: Path) -> None:
    directory = copy_squad(tmp_path)
    (directory / "answers.jsonl").unlink()
    with pytest.raises(SquadDataError, match=r"squad-dev is not the squad-dev set: no answers"):
        load_questions(directory)


def test_a_malformed_line_is_refused_with_its_file_and_line_number(tmp_path: Path) -> None:
    directory = copy_squad(tmp_path)
    lines = (directory / "queries.jsonl").read_text().splitlines()
    lines[2] = lines[2][:20]
    (directory / "queries.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(SquadDataError, match=r"queries.jsonl line 3 is not JSON"):
        load_questions(directory)


def test_a_question_without_reference_answers_is_refused_by_id(tmp_path: Path) -> None:
    directory = copy_squad(tmp_path)
    lines = (directory / "answers.jsonl").read_text().splitlines()
    (directory / "answers.jsonl").write_text("\n".join(lines[1:]) + "\n")
    first_id = json.loads(lines[0])["_id"]
    with pytest.raises(SquadDataError, match=f"answers.jsonl has nothing for question {first_id}"):
        load_questions(directory, limit=3)


def test_a_limit_below_one_question_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 question"):
        load_questions(limit=0)
