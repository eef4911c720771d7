"""The squad-dev questions with their gold passages and reference answers.

`../shared/eval/squad-dev` is SQuAD v1.1's dev set in BEIR layout (its SOURCE.md): passages in
corpus.jsonl, questions in queries.jsonl, each question's gold passage in qrels/test.tsv, and the
reference answers (several accepted spellings per question) in answers.jsonl, keyed by question
id. The selection is the first N questions in queries.jsonl's order: the file is itself a fixed
random sample of the dev set, so its head is a fair sample too, and the same for every run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SQUAD_DIR = Path(__file__).resolve().parents[2] / "shared" / "eval" / "squad-dev"
REQUIRED_FILES = ("corpus.jsonl", "queries.jsonl", "answers.jsonl", "qrels/test.tsv")


class SquadDataError(ValueError):
    """The squad-dev directory is missing a file or a file is malformed; says which and why."""


@dataclass(frozen=True, slots=True)
class Passage:
    passage_id: str
    title: str  # the Wikipedia article, with spaces ("Super Bowl 50")
    text: str


@dataclass(frozen=True, slots=True)
class SquadQuestion:
    question_id: str
    question: str
    answers: tuple[str, ...]
    passage: Passage  # the gold passage: the one the answers were marked in


def load_passages(directory: Path = DEFAULT_SQUAD_DIR) -> list[Passage]:
    """Every passage of the corpus, in file order."""
    path = _checked(directory) / "corpus.jsonl"
    return [
        Passage(row["_id"], str(row.get("title", "")).replace("_", " "), row["text"])
        for row in read_jsonl(path, ("_id", "text"))
    ]


def load_questions(
    directory: Path = DEFAULT_SQUAD_DIR, limit: int | None = None
) -> list[SquadQuestion]:
    """The first `limit` questions (all if None) in queries.jsonl's order, each with its gold
    passage and reference answers."""
    directory = _checked(directory)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1 question, got {limit}")
    passages = {passage.passage_id: passage for passage in load_passages(directory)}
    answers = {
        row["_id"]: tuple(row["answers"])
        for row in read_jsonl(directory / "answers.jsonl", ("_id", "answers"))
    }
    gold = gold_passage_ids(directory / "qrels/test.tsv")
    questions = []
    for row in read_jsonl(directory / "queries.jsonl", ("_id", "text")):
        question_id = row["_id"]
        for name, table in (("answers.jsonl", answers), ("qrels/test.tsv", gold)):
            if not table.get(question_id):
                raise SquadDataError(f"{directory / name} has nothing for question {question_id}")
        if gold[question_id] not in passages:
            raise SquadDataError(
                f"{directory / 'qrels/test.tsv'} names passage {gold[question_id]} for question "
                f"{question_id}, but corpus.jsonl has no such passage"
            )
        questions.append(
            SquadQuestion(
                question_id, row["text"], answers[question_id], passages[gold[question_id]]
            )
        )
        if limit is not None and len(questions) == limit:
            break
    return questions


def _checked(directory: Path) -> Path:
    directory = Path(directory)
    for name in REQUIRED_FILES:
        if not (directory / name).is_file():
            raise SquadDataError(
                f"{directory} is not the squad-dev set: no {name} (see SOURCE.md in "
                f"{DEFAULT_SQUAD_DIR} for the layout)"
            )
    return directory


def read_jsonl(path: Path, fields: tuple[str, ...]) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise SquadDataError(f"{path} line {number} is not JSON: {error}") from None
            missing = [name for name in fields if name not in row]
            if missing:
                raise SquadDataError(f"{path} line {number} has no {', '.join(missing)}")
            rows.append(row)
    return rows


def gold_passage_ids(path: Path) -> dict[str, str]:
    """Question id -> its gold passage id (SQuAD marks each answer in exactly one passage)."""
    gold: dict[str, str] = {}
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            parts = line.rstrip("\n").split("\t")
            if number == 1 and parts[0] == "query-id":
                continue
            if len(parts) < 3:
                raise SquadDataError(f"{path} line {number} has fewer than 3 tab-separated fields")
            if float(parts[2]) > 0:
                gold.setdefault(parts[0], parts[1])
    return gold
