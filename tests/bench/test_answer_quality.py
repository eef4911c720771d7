"""bench.answer_quality: the prompts it measures and its smoke run on the real bundled model."""

from __future__ import annotations

import json
import logging

import pytest
from transformers import AutoTokenizer

from bench.answer_quality import (
    SHORT_ANSWER_PROMPT,
    SMOKE_INDEX_PASSAGES,
    SMOKE_QUESTIONS,
    format_table,
    gold_passage_prompts,
    gold_passage_text,
    main,
)
from bench.squad_questions import DEFAULT_SQUAD_DIR, load_passages, load_questions
from bench.squad_retrieval import passages_to_index
from inference.engine.config import resolve_auto_dtype
from inference.prompts import PromptBuilder

pytestmark = pytest.mark.skipif(
    not DEFAULT_SQUAD_DIR.is_dir(), reason=f"the squad-dev set is not at {DEFAULT_SQUAD_DIR}"
)


def test_a_gold_passage_prompt_is_the_chat_template_of_the_instruction_and_the_passage(
    chat_model_dir,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    questions = load_questions(limit=3)
    builder = PromptBuilder(tokenizer, SHORT_ANSWER_PROMPT, max_model_len=4096)
    for question, prompt in zip(questions, gold_passage_prompts(builder, questions), strict=True):
        messages = [
            {"role": "system", "content": SHORT_ANSWER_PROMPT},
            {"role": "user", "content": gold_passage_text(question)},
        ]
        expected = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert tokenizer.decode(prompt) == expected
        assert question.passage.text in expected and expected.count(question.question) == 1


@pytest.mark.real_weights
@pytest.mark.django_db
def test_the_smoke_run_scores_both_modes_on_the_bundled_model(settings, tmp_path, capsys) -> None:
    settings.MEDIA_ROOT = tmp_path / "media"  # the end-to-end index's uploaded passages
    status = main(["--smoke", "--json", "--models-dir", str(settings.MODELS_DIR)])
    assert status == 0
    report = json.loads(capsys.readouterr().out)

    questions = load_questions(limit=SMOKE_QUESTIONS)
    indexed = passages_to_index(questions, load_passages(), SMOKE_INDEX_PASSAGES)
    assert report["config"]["questions"] == SMOKE_QUESTIONS
    assert report["config"]["retrieval"]["passages"] == len(indexed)
    assert 0 <= report["config"]["retrieval"]["gold_retrieved"] <= 1
    rows = report["results"]
    assert [(row["model"], row["quantization"], row["mode"]) for row in rows] == [
        ("smollm2-135m-instruct", "none", "gold"),
        ("smollm2-135m-instruct", "none", "e2e"),
    ]
    for row in rows:
        assert row["num_questions"] == SMOKE_QUESTIONS
        assert [a["question_id"] for a in row["answers"]] == [q.question_id for q in questions]
        assert all(a["answer"] and 1 <= a["answer_tokens"] <= 32 for a in row["answers"])
        # Even the 135M model gets part of an answer right in five questions.
        assert 0 < row["f1"] <= 1 and 0 <= row["exact_match"] <= row["contained"] <= 1
        assert row["f1"] == pytest.approx(
            sum(a["f1"] for a in row["answers"]) / SMOKE_QUESTIONS, abs=1e-3
        )
        assert row["seconds"] > 0 and row["weights_mb"] > 0
    assert 0 <= rows[1]["gold_retrieved"] <= 1

    table = format_table(report)
    lines = [line for line in table.splitlines() if line.startswith("| smollm2")]
    assert len(lines) == 2
    # the precision column names what "auto" resolved to on this CPU (bf16 where it is native)
    auto_dtype = str(resolve_auto_dtype()).removeprefix("torch.")
    assert lines[0].startswith(f"| smollm2-135m-instruct | {auto_dtype} | gold passage | ")
    assert f"{rows[0]['f1']:.3f}" in lines[0] and f"{rows[1]['f1']:.3f}" in lines[1]


def test_an_unknown_quantization_stops_the_run_with_a_reason(settings, caplog) -> None:
    argv = ["--smoke", "--mode", "gold", "--quantization", "int3"]
    with caplog.at_level(logging.ERROR):
        assert main([*argv, "--models-dir", str(settings.MODELS_DIR)]) == 2
    assert "smollm2-135m-instruct int3: quantization 'int3'" in caplog.text


def test_an_unknown_model_stops_the_run_with_a_reason(settings, caplog) -> None:
    argv = ["--mode", "gold", "--model", "no-such-model", "--questions", "1"]
    with caplog.at_level(logging.ERROR):
        assert main([*argv, "--models-dir", str(settings.MODELS_DIR)]) == 2
    assert "model no-such-model:" in caplog.text


def test_a_directory_that_is_not_squad_dev_stops_the_run_naming_the_missing_file(
    tmp_path, caplog
) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["--mode", "gold", "--squad-dir", str(tmp_path)]) == 2
    assert f"{tmp_path} is not the squad-dev set: no corpus.jsonl" in caplog.text
