"""bench.chunk_reuse: its smoke run on the real bundled model, through the chat's own prompts."""

from __future__ import annotations

import json

import pytest

from bench.chunk_reuse import SMOKE_QUESTIONS, format_table, load_eval_set, main
from bench.squad_questions import DEFAULT_SQUAD_DIR, load_questions

pytestmark = pytest.mark.skipif(
    not DEFAULT_SQUAD_DIR.is_dir(), reason=f"the squad-dev set is not at {DEFAULT_SQUAD_DIR}"
)


@pytest.mark.real_weights
@pytest.mark.django_db
def test_the_smoke_run_reuses_passages_in_one_mode_and_prefills_them_in_the_other(
    settings, tmp_path, capsys
) -> None:
    settings.MEDIA_ROOT = tmp_path / "media"  # the end-to-end index's uploaded passages
    assert main(["--smoke", "--json", "--models-dir", str(settings.MODELS_DIR)]) == 0
    report = json.loads(capsys.readouterr().out)

    assert report["config"]["questions"] == SMOKE_QUESTIONS
    table = format_table(report)
    assert "| reuse |" in table
    assert f"Ingestion: {report['ingestion']['passages']} passages" in table
    full, reuse = report["full"], report["reuse"]
    assert full["mean_reused_tokens"] == 0 < reuse["mean_reused_tokens"]
    # Full prefill computes nearly the whole prompt (the system prompt is cached); reuse
    # computes the question, the headings and each passage's first tokens.
    assert report["computed_share"]["reuse"] < report["computed_share"]["full"] <= 1
    assert report["ingestion"]["passages"] >= SMOKE_QUESTIONS
    # the cache holds this run whole: every passage found where the ingestion left it
    assert report["evicted_passages_computed_again"] == 0
    assert all(full["answers"]) and all(reuse["answers"])
    for mode in (full, reuse):
        # asked again, the whole prompt is in the prefix cache
        assert (
            0 <= mode["repeat_ttft_s"]["p50"] <= mode["ttft_s"]["p50"] and mode["ttft_s"]["p50"] > 0
        )
        assert 0 <= mode["f1"] <= 1
    assert report["ttft_ratio_full_over_reuse"] > 0
    low, high = report["f1_difference_ci95"]
    assert low <= report["f1_difference"] <= high
    assert len(full["f1_per_question"]) == len(reuse["f1_per_question"]) == SMOKE_QUESTIONS
    assert set(full["reused_tokens_per_question"]) == {0}
    assert sum(reuse["reused_tokens_per_question"]) / SMOKE_QUESTIONS == reuse["mean_reused_tokens"]


def test_skipped_questions_continue_where_an_earlier_run_stopped() -> None:
    earlier = load_questions(DEFAULT_SQUAD_DIR, 5)
    later, corpus = load_eval_set(DEFAULT_SQUAD_DIR, 3, skip=2)
    assert [q.question_id for q in later] == [q.question_id for q in earlier[2:]]
    assert corpus
