# ruff: noqa: RUF001 - Chinese text with its full-width punctuation, on purpose
"""BM25 in PostgreSQL (retrieval.lexical_postgres, retrieval.postings) against bm25s.

Integration pass only (DATABASE_URL=postgres://...): the inverted index lives in PostgreSQL.
The corpus is real: passages of the Debian Reference sets in eval/ (English and Chinese),
stored by ingestion's own `store()` (chunks and postings in one transaction; the embedding
step is not what is tested here, so the passages are the chunks).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, connections

from chatsite.health import run_checks
from retrieval import postings
from retrieval.chunking import ChunkDraft
from retrieval.ingest import Prepared, fail, store
from retrieval.inverted_index import CorpusShard
from retrieval.lexical_postgres import PostgresLexicalStore
from retrieval.lexical_store import InProcessLexicalStore, lexical_store_name
from retrieval.models import Chunk, Collection, Document
from retrieval.search import search_pool
from tests.documents import add_document
from tests.retrieval.postings_state import assert_statistics_equal_a_rebuild, statistics

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

EVAL = Path(__file__).resolve().parents[2] / "eval"
PASSAGES_PER_DOCUMENT = 3


@pytest.fixture(autouse=True)
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("runs in the integration pass (DATABASE_URL=postgres://...)")


def read_jsonl(path: Path, limit: int) -> list[dict[str, str]]:
    with path.open() as handle:
        return [json.loads(line) for _, line in zip(range(limit), handle, strict=False)]


def passages(set_name: str, limit: int) -> list[str]:
    return [
        f"{row['title']}\n\n{row['text']}"
        for row in read_jsonl(EVAL / set_name / "corpus.jsonl", limit)
    ]


def queries(set_name: str, limit: int) -> list[str]:
    return [row["text"] for row in read_jsonl(EVAL / set_name / "queries.jsonl", limit)]


def drafts(texts: list[str]) -> list[ChunkDraft]:
    return [ChunkDraft(text, len(text.split()), 0, len(text)) for text in texts]


def stored(collection: Collection, name: str, texts: list[str]) -> Document:
    """A ready document whose chunks are `texts`, written as ingestion writes them."""
    document = add_document(collection, name, "\n\n".join(texts))
    store(Prepared(document, drafts(texts)))
    return document


def store_corpus(collection: Collection, texts: list[str], prefix: str) -> list[Document]:
    return [
        stored(collection, f"{prefix}-{start}.txt", texts[start : start + PASSAGES_PER_DOCUMENT])
        for start in range(0, len(texts), PASSAGES_PER_DOCUMENT)
    ]


def assert_same_ranking(got: list[tuple[int, float]], expected: list[tuple[int, float]]) -> None:
    """Same scores rank by rank; the same chunks, except in any order among equal scores."""
    assert len(got) == len(expected)
    assert [s for _, s in got] == pytest.approx([s for _, s in expected], rel=1e-5, abs=1e-6)

    if not expected:
        return
    cut = expected[-1][1]

    def near(ranking: list[tuple[int, float]], score: float) -> set[int]:
        return {chunk_id for chunk_id, s in ranking if abs(s - score) <= 1e-5 * score}

    for _, score in expected:
        if abs(score - cut) > 1e-5 * cut:  # the cut at `limit` may fall inside a tie
            assert near(got, score) == near(expected, score)


def assert_equal_to_bm25s(query_texts: list[str], limit: int = 20) -> None:
    database, reference = PostgresLexicalStore(), InProcessLexicalStore()
    compared = 0
    for query in query_texts:
        expected = reference.search(query, limit)
        assert_same_ranking(database.search(query, limit), expected)
        compared += bool(expected)
    assert compared >= len(query_texts) * 0.8  # the queries do match the corpus


def test_scores_and_rankings_equal_bm25s_on_english_and_chinese_passages() -> None:
    collection = Collection.objects.create(name="debian")
    store_corpus(collection, passages("debian-reference-cross", 120), "en")
    store_corpus(collection, passages("debian-reference-zh", 120), "zh")
    # English questions, Chinese questions (jieba's segmentation + bigrams), and questions
    # asked across the languages (matching shared Latin terms only).
    assert_equal_to_bm25s(queries("debian-reference-cross-en", 25))
    assert_equal_to_bm25s(queries("debian-reference-zh", 25))
    assert_equal_to_bm25s([*queries("debian-reference-cross", 10), "apt-get", "/etc/fstab"])


def test_chinese_queries_find_chinese_passages_by_jieba_words_and_traditional_forms() -> None:
    collection = Collection.objects.create(name="zh")
    stored(
        collection,
        "cache.txt",
        [
            "启用前缀缓存后，KV缓存命中率可以达到98.6%，首字延迟明显下降。",
            "连续批处理让多个请求共享一次前向计算，从而提高吞吐量。",
            "Speculative decoding drafts tokens with a small model; apt-get installs it.",
        ],
    )
    ids = list(Chunk.objects.order_by("ordinal").values_list("id", flat=True))
    store_ = PostgresLexicalStore()
    assert store_.search("缓存命中率是多少？", 3)[0][0] == ids[0]
    assert store_.search("如何提高吞吐量", 3)[0][0] == ids[1]
    assert store_.search("快取命中率", 3)[0][0] == ids[0]  # Traditional/Taiwanese wording
    assert store_.search("apt-get", 3)[0][0] == ids[2]
    assert store_.search("的 了 是", 3) == []  # stopwords only
    assert_equal_to_bm25s(["缓存命中率是多少？", "如何提高吞吐量", "快取命中率", "apt-get"], 3)


def test_ingesting_reingesting_and_deleting_documents_leave_what_a_rebuild_leaves() -> None:
    english = passages("debian-reference-cross", 60)
    chinese = passages("debian-reference-zh", 30)
    collection = Collection.objects.create(name="changing")
    other = Collection.objects.create(name="other")
    documents = store_corpus(collection, english[:45], "en")
    kept = stored(other, "zh.txt", chinese[:15])
    # Re-ingest: the same document, now with other passages (its old chunks and their
    # postings go, in the same transaction).
    store(Prepared(documents[0], drafts(english[45:])))
    store(Prepared(kept, drafts(chinese[15:])))
    # Delete: one document, then a whole collection (Django's cascade), then a failure.
    documents[1].delete()
    Collection.objects.get(name="other").delete()
    fail(documents[2], "turned unreadable")
    queries_ = queries("debian-reference-cross-en", 15) + queries("debian-reference-zh", 5)
    assert_equal_to_bm25s(queries_)
    assert postings.corpus_totals()[0] == Chunk.objects.count()
    assert_statistics_equal_a_rebuild()
    assert_equal_to_bm25s(queries_)
    # Everything gone: nothing is left behind in the statistics.
    Collection.objects.all().delete()
    assert statistics() == {"df": {}, "corpus": (0, 0), "postings": set(), "chunks": set()}


def test_a_chunk_outside_the_allowed_collections_is_never_returned(retriever) -> None:
    assert retriever.lexical.name == "postgresql" == lexical_store_name()
    health = run_checks()["components"]["lexical_store"]
    assert health["state"] == "ok"
    assert health["detail"] == "postgresql inverted index (0 chunks)"
    secret = Collection.objects.create(name="secret")
    public = Collection.objects.create(name="public")
    stored(secret, "salaries.txt", ["The salary bands of the kitchen staff are confidential."])
    stored(public, "kitchen.txt", ["The kitchen is cleaned on Fridays by the staff."])
    reader = User.objects.create_user("reader")
    public.readers.add(reader)
    hits = search_pool("kitchen staff salary bands", user=reader, mode="bm25")
    assert [entry.hit.document_title for entry in hits] == ["kitchen.txt"]
    store_ = PostgresLexicalStore()
    only_public = store_.search("salary bands", 10, collection_ids=[public.pk])
    assert only_public == []
    assert store_.search("salary bands", 10, collection_ids=[]) == []
    everything = [entry.hit.document_title for entry in search_pool("salary", mode="bm25")]
    assert everything == ["salaries.txt"]  # a trusted caller (None) sees all collections
    secret_ids = set(Chunk.objects.filter(document__collection=secret).values_list("id", flat=True))
    for query in ("kitchen", "staff", "confidential salary kitchen"):
        found = {cid for cid, _ in store_.search(query, 10, collection_ids=[public.pk])}
        assert found and not found & secret_ids


def test_a_document_being_reingested_or_failed_is_not_found_meanwhile() -> None:
    collection = Collection.objects.create(name="status")
    document = stored(collection, "kitchen.txt", ["The kitchen is cleaned on Fridays."])
    Document.objects.filter(pk=document.pk).update(status=Document.Status.PROCESSING)
    assert PostgresLexicalStore().search("kitchen", 5) == []
    Document.objects.filter(pk=document.pk).update(status=Document.Status.READY)
    assert len(PostgresLexicalStore().search("kitchen", 5)) == 1


def test_two_workers_storing_documents_at_once_leave_correct_statistics() -> None:
    collection = Collection.objects.create(name="concurrent")
    texts = passages("debian-reference-cross", 80)
    halves = [texts[:40], texts[40:]]
    documents = [
        [add_document(collection, f"w{w}-{i}.txt", text) for i, text in enumerate(half)]
        for w, half in enumerate(halves)
    ]
    doomed = Collection.objects.create(name="doomed")
    store_corpus(doomed, passages("debian-reference-zh", 30) + texts[:30], "doomed")
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def ingest_all(worker: int) -> None:
        # NOTE: every document shares common terms with the other worker's, so both update
        # the same TermStats rows in overlapping transactions; the second pass re-ingests each
        # document with the other worker's text (old terms out, new ones in, in one go).
        for document, text in zip(documents[worker], halves[worker], strict=True):
            store(Prepared(document, drafts([text, text.upper()])))
        for document, other in zip(documents[worker], halves[1 - worker], strict=True):
            store(Prepared(document, drafts([other])))

    def delete_collection() -> None:
        # Django deletes its documents one by one: several passes over TermStats in one
        # transaction, the case that takes the statistics lock exclusively.
        Collection.objects.get(name="doomed").delete()

    def run(work: Callable[[], None]) -> None:
        try:
            start.wait()
            work()
        except BaseException as error:  # reported by the test below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=run, args=(work,))
        for work in (lambda: ingest_all(0), lambda: ingest_all(1), delete_collection)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert Chunk.objects.count() == 80
    assert postings.corpus_totals()[0] == 80
    assert CorpusShard.objects.filter(num_chunks__gt=0).count() > 1  # not one hot row
    assert_statistics_equal_a_rebuild()
    assert_equal_to_bm25s(queries("debian-reference-cross-en", 20))


def test_the_backfill_command_indexes_chunks_stored_before_the_upgrade() -> None:
    collection = Collection.objects.create(name="old")
    store_corpus(collection, passages("debian-reference-cross", 30), "old")
    store_corpus(collection, passages("debian-reference-zh", 15), "old-zh")
    expected = statistics()
    with connection.cursor() as cursor:  # what a deployment had before the tables existed
        for table in ("posting", "indexedchunk", "termstats", "corpusshard"):
            cursor.execute(f"DELETE FROM retrieval_{table}")
    assert PostgresLexicalStore().search("shell prompt", 5) == []
    assert "45 chunks not indexed" in PostgresLexicalStore().describe()
    call_command("backfill_postings", "--batch-size", "7")
    assert statistics() == expected
    assert "not indexed" not in PostgresLexicalStore().describe()
    call_command("backfill_postings")  # nothing left to do: changes nothing
    assert statistics() == expected
    assert_equal_to_bm25s(queries("debian-reference-cross-en", 10))


def test_eval_retrieval_scores_bm25_with_both_stores_over_one_ingestion(
    retriever, tmp_path
) -> None:
    beir = tmp_path / "set"
    (beir / "qrels").mkdir(parents=True)
    rows = read_jsonl(EVAL / "debian-reference-zh" / "corpus.jsonl", 60)
    (beir / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    source = EVAL / "debian-reference-zh"
    (beir / "queries.jsonl").write_text((source / "queries.jsonl").read_text())
    ids = {row["_id"] for row in rows}
    qrels = (source / "qrels" / "test.tsv").read_text().splitlines()
    kept = [line for line in qrels[1:] if line.split("\t")[1] in ids]
    (beir / "qrels" / "test.tsv").write_text("\n".join([qrels[0], *kept]) + "\n")
    out = StringIO()
    options = ["--modes=bm25", "--lexical-store=bm25s,postgresql", "--max-queries=40"]
    call_command("eval_retrieval", str(beir), *options, stdout=out)
    scores = json.loads(out.getvalue())["by_lexical_store"]
    database, reference = scores["postgresql"]["bm25"], scores["bm25s"]["bm25"]
    for metric in ("recall1", "recall5", "ndcg10"):
        assert database[metric] == pytest.approx(reference[metric])
    assert scores["postgresql"]["bm25"]["ndcg10"] > 0.5
    assert statistics() == {"df": {}, "corpus": (0, 0), "postings": set(), "chunks": set()}
