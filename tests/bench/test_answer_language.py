"""bench.answer_language: the Debian Reference sets it reads, and its smoke run on the bundled
model."""

from __future__ import annotations

import json
import logging

import pytest

from bench.answer_language import (
    EVAL_DIR,
    SETS,
    SMOKE_QUESTIONS,
    format_table,
    load_set,
    main,
    ratios,
    system_prompts,
)
from chat.models import DEFAULT_SYSTEM_PROMPT


def test_the_chinese_set_is_measured_on_its_answered_questions_spread_over_the_chapters():
    questions = load_set(EVAL_DIR / SETS["zh"], None)
    assert len(questions) == 60
    assert {q.question_id[:4] for q in questions} == {"zh-q"}
    # every chapter of the book has questions among them (passage ids are zh-CC-NNN)
    assert {q.passage.passage_id[3:5] for q in questions} == {f"{n:02}" for n in range(1, 13)}
    for question in questions:
        # each reference is excerpts copied from the gold passage, joined by " … "
        (reference,) = question.answers
        for excerpt in reference.split(" … "):
            assert excerpt in question.passage.text, (question.question_id, excerpt)
    assert [q.question_id for q in load_set(EVAL_DIR / SETS["zh"], 3)] == [
        "zh-q001", "zh-q005", "zh-q010",
    ]  # fmt: skip


def test_a_set_without_answers_is_sampled_evenly_and_scored_for_language_only():
    questions = load_set(EVAL_DIR / SETS["cross"], 4)
    assert [q.question_id for q in questions] == [
        "zh2en-q001", "zh2en-q018", "zh2en-q035", "zh2en-q052",
    ]  # fmt: skip
    assert all(q.answers == () and q.passage.passage_id.startswith("en-") for q in questions)


def test_the_old_and_new_system_prompts_differ_by_the_language_sentence_only():
    prompts = system_prompts()
    assert prompts["new"] == DEFAULT_SYSTEM_PROMPT
    assert prompts["new"] == prompts["old"] + (
        " Answer in the language of the question, not of the documents."
    )


def test_ratios_are_new_over_old_for_the_scores_the_old_prompt_has():
    rows = [
        {"set": "zh", "mode": "gold", "system_prompt": "old", "in_language": 0.8, "f1": 0.4,
         "recall": 0.5, "cites_gold": 0.0},
        {"set": "zh", "mode": "gold", "system_prompt": "new", "in_language": 1.0, "f1": 0.5,
         "recall": 0.5, "cites_gold": 0.1},
    ]  # fmt: skip
    assert ratios(rows) == [
        {"set": "zh", "mode": "gold", "system_prompt": "new", "in_language": 1.25, "f1": 1.25,
         "recall": 1.0}
    ]  # fmt: skip


@pytest.mark.real_weights
@pytest.mark.django_db
def test_the_smoke_run_scores_both_prompts_in_both_modes(settings, tmp_path, capsys) -> None:
    settings.MEDIA_ROOT = tmp_path / "media"  # the end-to-end index's uploaded passages
    status = main(["--smoke", "--json", "--models-dir", str(settings.MODELS_DIR)])
    assert status == 0
    report = json.loads(capsys.readouterr().out)

    assert report["config"]["questions"] == {"zh": SMOKE_QUESTIONS}
    assert report["config"]["system_prompts"] == system_prompts()
    rows = report["results"]
    assert [(row["set"], row["system_prompt"], row["mode"]) for row in rows] == [
        ("zh", "old", "gold"), ("zh", "old", "e2e"), ("zh", "new", "gold"), ("zh", "new", "e2e"),
    ]  # fmt: skip
    expected_ids = [q.question_id for q in load_set(EVAL_DIR / SETS["zh"], SMOKE_QUESTIONS)]
    for row in rows:
        assert [a["question_id"] for a in row["answers"]] == expected_ids
        assert all(1 <= a["answer_tokens"] <= 64 for a in row["answers"])
        for key in ("in_language", "f1", "recall", "cites", "cites_gold"):
            assert 0 <= row[key] <= 1
        assert row["f1"] == pytest.approx(
            sum(a["f1"] for a in row["answers"]) / SMOKE_QUESTIONS, abs=1e-3
        )
        assert row["in_language"] == pytest.approx(
            sum(a["in_language"] for a in row["answers"]) / SMOKE_QUESTIONS, abs=1e-3
        )
    assert all(0 <= row["gold_retrieved"] <= 1 for row in rows if row["mode"] == "e2e")
    assert [(r["set"], r["mode"], r["system_prompt"]) for r in report["ratios"]] == [
        ("zh", "gold", "new"), ("zh", "e2e", "new"),
    ]  # fmt: skip

    table = format_table(report)
    assert table.count("| zh questions, zh passages | gold passage | ") == 3  # old, new, ratio
    assert "smollm2-135m-instruct" in table.splitlines()[0]


def test_an_unknown_model_stops_the_run_with_a_reason(settings, caplog) -> None:
    argv = ["--mode", "gold", "--model", "no-such-model", "--questions", "1"]
    with caplog.at_level(logging.ERROR):
        assert main([*argv, "--models-dir", str(settings.MODELS_DIR)]) == 2
    assert "model no-such-model:" in caplog.text


def test_a_directory_that_is_not_a_set_stops_the_run_naming_the_missing_file(
    tmp_path, caplog
) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["--mode", "gold", "--eval-dir", str(tmp_path)]) == 2
    assert f"{tmp_path / SETS['zh']} is not a BEIR-layout set: no corpus.jsonl" in caplog.text
