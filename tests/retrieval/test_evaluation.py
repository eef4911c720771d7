"""retrieval.evaluation and `manage.py eval_retrieval`: metrics, and a smoke run on a tiny set."""

from __future__ import annotations

import json
import math
import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from retrieval.evaluation import load_beir, score_ranking
from retrieval.models import Chunk, Collection, Document

METRICS = {"recall1", "recall5", "recall10", "mrr10", "ndcg10", "p50_ms", "p95_ms"}


def test_a_relevant_document_at_rank_one_scores_one_everywhere() -> None:
    assert score_ranking(["a", "b"], {"a"}) == {
        "recall1": 1.0,
        "recall5": 1.0,
        "recall10": 1.0,
        "mrr10": 1.0,
        "ndcg10": 1.0,
    }


def test_metrics_of_a_hand_computed_ranking() -> None:
    # relevant at ranks 2 and 7 of 11; two relevant in all.
    ranked = ["x1", "r1", "x2", "x3", "x4", "x5", "r2", "x6", "x7", "x8", "x9"]
    scores = score_ranking(ranked, {"r1", "r2"})
    ideal = 1 + 1 / math.log2(3)
    assert scores == pytest.approx(
        {
            "recall1": 0.0,
            "recall5": 0.5,
            "recall10": 1.0,
            "mrr10": 0.5,
            "ndcg10": (1 / math.log2(3) + 1 / math.log2(8)) / ideal,
        }
    )


def test_a_relevant_document_below_rank_ten_counts_for_nothing() -> None:
    ranked = [f"x{i}" for i in range(10)] + ["r"]
    assert score_ranking(ranked, {"r"}) == {
        "recall1": 0.0,
        "recall5": 0.0,
        "recall10": 0.0,
        "mrr10": 0.0,
        "ndcg10": 0.0,
    }


def write_beir(directory: Path) -> Path:
    corpus = [
        ("d1", "Kitchen", "The office kitchen is cleaned every Friday by the facilities team."),
        ("d2", "Leave", "Every employee gets thirty days of paid holiday each year."),
        ("d3", "Travel", "Trains are preferred over flights for trips under 600 kilometres."),
        ("d4", "Parking", "Bicycles are parked in the basement; cars use the public garage."),
    ]
    queries = [
        ("q1", "When is the kitchen cleaned?"),
        ("q2", "How many days of paid holiday do employees get?"),
        ("q3", "Are trains preferred over flights?"),
        ("q4", "a query without judgements"),
    ]
    (directory / "qrels").mkdir(parents=True)
    (directory / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in corpus)
    )
    (directory / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": i, "text": x}) + "\n" for i, x in queries)
    )
    (directory / "qrels/test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td3\t1\nq3\td4\t0\n"
    )
    return directory


def test_load_beir_keeps_only_positive_judgements(tmp_path) -> None:
    corpus, queries, qrels = load_beir(write_beir(tmp_path / "set"))
    assert len(corpus) == 4 and len(queries) == 4
    assert qrels == {"q1": {"d1"}, "q2": {"d2"}, "q3": {"d3"}}


@pytest.mark.django_db
def test_eval_retrieval_prints_every_mode_and_cleans_up(retriever, tmp_path) -> None:
    out = StringIO()
    call_command("eval_retrieval", str(write_beir(tmp_path / "set")), "--reranker=none", stdout=out)
    result = json.loads(out.getvalue())
    for mode in ("bm25", "dense", "hybrid", "hybrid+rerank"):
        assert set(result[mode]) == METRICS
        assert 0.0 <= result[mode]["ndcg10"] <= 1.0
    assert result["bm25"]["recall1"] == 1.0  # each query shares its key words with one passage
    assert result["ingest_chunks_per_s"] > 0
    assert (result["num_queries"], result["num_chunks"]) == (3, 4)
    assert not Collection.objects.exists() and not Document.objects.exists()
    assert not Chunk.objects.exists()


@pytest.mark.django_db
def test_eval_retrieval_measures_the_embedding_model_it_is_given(retriever, tmp_path) -> None:
    out = StringIO()
    beir = str(write_beir(tmp_path / "set"))
    options = ["--reranker=none", "--embedding-model=multilingual-e5-small"]
    call_command("eval_retrieval", beir, *options, stdout=out)
    result = json.loads(out.getvalue())
    assert result["embedding_model"] == "multilingual-e5-small"
    assert result["dense"]["recall1"] == 1.0
    with pytest.raises(CommandError, match="no such model"):
        call_command("eval_retrieval", beir, "--embedding-model=./nowhere")


@pytest.mark.django_db
def test_eval_retrieval_scores_the_modes_and_lexical_stores_it_is_asked_for(
    retriever, tmp_path
) -> None:
    out = StringIO()
    beir = str(write_beir(tmp_path / "set"))
    call_command("eval_retrieval", beir, "--modes=bm25", "--lexical-store=bm25s", stdout=out)
    result = json.loads(out.getvalue())
    assert set(result["by_lexical_store"]) == {"bm25s"}
    assert set(result["by_lexical_store"]["bm25s"]) == {"bm25"}
    assert result["by_lexical_store"]["bm25s"]["bm25"]["recall1"] == 1.0
    assert result["num_chunks"] == 4 and not Chunk.objects.exists()
    with pytest.raises(CommandError, match="--modes: expected some of bm25, dense"):
        call_command("eval_retrieval", beir, "--modes=bm25,sparse")
    with pytest.raises(CommandError, match="--lexical-store: .*needs a PostgreSQL database"):
        call_command("eval_retrieval", beir, "--lexical-store=bm25s,postgresql")


@pytest.mark.django_db
def test_eval_retrieval_refuses_a_directory_that_is_not_a_beir_set(tmp_path) -> None:
    with pytest.raises(CommandError, match="not a BEIR-layout set"):
        call_command("eval_retrieval", str(tmp_path))


EVAL_DIR = Path(__file__).resolve().parents[2] / "eval"


@pytest.mark.parametrize(
    ("name", "min_queries", "query_script", "corpus_script"),
    [
        ("debian-reference-zh", 200, "han", "han"),
        ("debian-reference-cross", 60, "han", "latin"),
        ("debian-reference-cross-en", 60, "latin", "han"),
    ],
)
def test_the_chinese_sets_are_beir_sets_whose_every_question_has_its_passage(
    name, min_queries, query_script, corpus_script
) -> None:
    corpus, queries, qrels = load_beir(EVAL_DIR / name)
    ids = {passage["_id"] for passage in corpus}
    assert len(queries) >= min_queries and set(qrels) == set(queries)
    assert all(relevant <= ids for relevant in qrels.values())

    def is_han(text: str) -> bool:
        return any("\u4e00" <= c <= "\u9fff" for c in text)

    assert all(is_han(q) == (query_script == "han") for q in queries.values())
    # NOTE: one passage of the Chinese translation was left in English upstream.
    num_han = sum(is_han(p["text"]) for p in corpus)
    assert num_han >= 0.99 * len(corpus) if corpus_script == "han" else num_han == 0
    # written, not copied: no question repeats 8 Chinese characters or 8 words of its passage
    passages = {passage["_id"]: passage["text"] for passage in corpus}
    for query_id, question in queries.items():
        [passage_id] = qrels[query_id]
        assert not _shares_a_run(question, passages[passage_id], 8), question


def _shares_a_run(question: str, passage: str, length: int) -> bool:
    han_runs = re.findall(r"[\u4e00-\u9fff]+", question)
    if any(
        run[i : i + length] in passage for run in han_runs for i in range(len(run) - length + 1)
    ):
        return True
    words, passage_words = question.lower().split(), " ".join(passage.lower().split())
    return any(
        " ".join(words[i : i + length]) in passage_words for i in range(len(words) - length + 1)
    )
