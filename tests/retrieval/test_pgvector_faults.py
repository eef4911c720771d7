"""The pgvector store under faults, on the real bundled server: PostgreSQL restarted under
searches and mid-ingestion, the HNSW index rebuilt while queries run."""

from __future__ import annotations

import threading
import time

import numpy as np
import psycopg
import pytest
from django.db import DatabaseError, close_old_connections, connection, connections

from retrieval import postings
from retrieval.ingest import ingest
from retrieval.models import Chunk, Collection, Document
from retrieval.pgvector_store import INDEX, PgVectorStore
from retrieval.search import search
from retrieval.unreachable_database import LexicalStoreUnavailable
from retrieval.vector_store import VectorStoreUnavailable
from tests.celery_workers import send_ingest, start_worker, stop_worker, worker_env
from tests.documents import HANDBOOK, KITCHEN, add_document
from tests.reliability.helpers import ThrowawayRedis
from tests.retrieval.postings_state import assert_statistics_equal_a_rebuild

pytestmark = pytest.mark.django_db(transaction=True)


def database_url() -> str:
    settings = connection.settings_dict
    return f"postgres://postgres@127.0.0.1:{settings['PORT']}/{settings['NAME']}"


def waits_for_the_model_record(watcher: psycopg.Connection) -> bool:
    """Whether an ingestion waits for the model record (held FOR UPDATE by the test): inside
    its transaction, its chunks and postings written and its vectors not yet."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE '%FOR SHARE%'"
    )
    return watcher.execute(query).fetchone()[0] == 1


def wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["dense", "bm25"])
def test_searches_across_a_postgresql_restart_answer_or_fail_clearly(
    pgvector_retriever, pgvector_database, mode
) -> None:
    assert pgvector_retriever.lexical.name == "postgresql"  # both stores in the database
    collection = Collection.objects.create(name="hr")
    ingest(add_document(collection, "handbook.md", HANDBOOK).pk, pgvector_retriever)
    ingest(add_document(collection, "kitchen.txt", KITCHEN).pk, pgvector_retriever)
    expected = [h.chunk_id for h in search("paid holiday", top_k=3, mode=mode)]
    assert expected
    outcomes: list[object] = []
    stop = threading.Event()

    def searcher() -> None:
        while not stop.is_set():
            close_old_connections()  # what the chat's thread does around each search
            try:
                outcomes.append([h.chunk_id for h in search("paid holiday", top_k=3, mode=mode)])
            except (VectorStoreUnavailable, LexicalStoreUnavailable, DatabaseError) as error:
                outcomes.append(error)
        connections.close_all()

    thread = threading.Thread(target=searcher)
    thread.start()
    try:
        wait_for(lambda: len(outcomes) >= 3)
        pgvector_database.restart("immediate")  # as if it crashed
        answered = len(outcomes)
        wait_for(lambda: any(o == expected for o in outcomes[answered:]))
    finally:
        stop.set()
        thread.join(30)
    connection.close()  # this thread's connection died with the server
    errors = [o for o in outcomes if not isinstance(o, list)]
    assert all(o == expected for o in outcomes if isinstance(o, list)), outcomes
    assert errors, "the restart was not seen by any search"
    for error in errors:
        assert str(error).strip(), repr(error)  # says what happened
    unavailable = [
        e for e in errors if isinstance(e, (VectorStoreUnavailable, LexicalStoreUnavailable))
    ]
    assert unavailable, errors  # the store's own error, not the driver's
    assert all("could not reach PostgreSQL" in str(e) for e in unavailable)


def test_a_restart_mid_ingestion_leaves_no_chunk_without_its_vector(
    pgvector_retriever, pgvector_database
) -> None:
    collection = Collection.objects.create(name="ops")
    kept = add_document(collection, "handbook.md", HANDBOOK)
    ingest(kept.pk, pgvector_retriever)
    kept_ids = set(Chunk.objects.filter(document=kept).values_list("id", flat=True))
    cut = add_document(collection, "kitchen.txt", KITCHEN)
    failures: list[BaseException] = []

    def ingestion() -> None:
        try:
            ingest(cut.pk, pgvector_retriever)
        except BaseException as error:  # handed to the test thread
            failures.append(error)
        finally:
            connections.close_all()

    # NOTE: holding the model record makes the ingestion wait inside its transaction, its chunks
    # written and its vectors not yet: the window a restart must not leave half-done.
    blocker = psycopg.connect(database_url(), autocommit=False)
    watcher = psycopg.connect(database_url(), autocommit=True)
    try:
        blocker.execute("SELECT 1 FROM retrieval_vector_store WHERE id = 1 FOR UPDATE")
        thread = threading.Thread(target=ingestion)
        thread.start()
        wait_for(lambda: waits_for_the_model_record(watcher))
        pgvector_database.restart("immediate")
        thread.join(60)
    finally:
        blocker.close()  # NOTE: closed, not committed: the restart ended its session
        watcher.close()
    connection.close()
    assert failures and isinstance(failures[0], DatabaseError), failures
    # nothing of the cut ingestion is there; what was ready before is whole
    assert not Chunk.objects.filter(document=cut).exists()
    assert pgvector_retriever.vectors.ids() == kept_ids
    # the task's retry (or start-up recovery) ingests it again, whole
    ingest(cut.pk, pgvector_retriever)
    assert Document.objects.get(pk=cut.pk).status == Document.Status.READY
    assert pgvector_retriever.vectors.ids() == set(Chunk.objects.values_list("id", flat=True))
    # the keyword index too: what a rebuild from the chunks writes, nothing of the cut attempt
    assert postings.corpus_totals()[0] == Chunk.objects.count()
    assert_statistics_equal_a_rebuild()


def test_a_workers_ingestion_cut_by_a_postgresql_restart_is_retried_and_ends_whole(
    pgvector_retriever, pgvector_database, settings, tmp_path
) -> None:
    """The Celery task's retry in a real worker (a broker of the test's own): the attempt the
    restart cuts leaves nothing, and the retry a few seconds later ingests the document whole."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    settings.MEDIA_ROOT = data_dir / "media"  # the worker reads the upload from its data dir
    document = add_document(Collection.objects.create(name="retried"), "handbook.md", HANDBOOK)

    def status() -> str:
        return Document.objects.values_list("status", flat=True).get(pk=document.pk)

    log_path = tmp_path / "worker.log"
    blocker = psycopg.connect(database_url(), autocommit=False)
    watcher = psycopg.connect(database_url(), autocommit=True)
    with ThrowawayRedis(tmp_path) as broker:
        env = worker_env(settings, data_dir, broker.url, CACHET_VECTOR_STORE="pgvector")
        worker = start_worker(env, log_path, "--pool", "solo")
        try:
            blocker.execute("SELECT 1 FROM retrieval_vector_store WHERE id = 1 FOR UPDATE")
            send_ingest(broker.url, document.pk)
            # the worker starts, extracts and embeds, then waits inside its transaction
            wait_for(lambda: waits_for_the_model_record(watcher), 180)
            pgvector_database.restart("immediate")
            blocker.close()  # NOTE: closed, not committed: the restart ended its session
            watcher.close()
            connection.close()  # this thread's connection died with the server
            wait_for(lambda: status() in {Document.Status.READY, Document.Status.FAILED}, 120)
        finally:
            stop_worker(worker)
    assert status() == Document.Status.READY, Document.objects.get(pk=document.pk).error
    log = log_path.read_text()
    assert f"ingesting document {document.pk} hit" in log and "retrying" in log, log[-3000:]
    chunk_ids = set(Chunk.objects.filter(document=document).values_list("id", flat=True))
    assert chunk_ids and pgvector_retriever.vectors.ids() == chunk_ids
    assert postings.corpus_totals()[0] == len(chunk_ids)
    assert_statistics_equal_a_rebuild()
    assert {h.chunk_id for h in search("paid holiday", top_k=3, mode="bm25")} <= chunk_ids


# Enough vectors that rebuilding their HNSW graph outlasts several searches (seconds).
ROWS = 4000


def test_searches_answer_while_the_hnsw_index_is_rebuilt(pgvector_retriever) -> None:
    rng = np.random.default_rng(3)
    collection = Collection.objects.create(name="synthetic")
    document = Document.objects.create(
        collection=collection, title="synthetic", status=Document.Status.READY
    )
    chunks = Chunk.objects.bulk_create(
        Chunk(document=document, ordinal=i, text=str(i), token_count=1, char_start=0, char_end=1)
        for i in range(ROWS)
    )
    store = pgvector_retriever.vectors
    vectors = rng.standard_normal((ROWS, store.dimension)).astype(np.float32)
    # NOTE: each query's 4 neighbours are near copies of it, so its top 5 stand far above the
    # rest (random directions, near-ties a graph search may order otherwise).
    for q in range(5):
        noise = rng.standard_normal((4, store.dimension)).astype(np.float32)
        vectors[5 + 4 * q : 9 + 4 * q] = vectors[q] + 0.3 * noise
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.array([c.pk for c in chunks])
    store.replace([], ids.tolist(), vectors)
    queries = vectors[:5]
    expected = [set(ids[np.argsort(-(vectors @ q))[:5]].tolist()) for q in queries]
    outcomes: list[bool] = []
    stop = threading.Event()

    def searcher() -> None:
        while not stop.is_set():
            for query, wanted in zip(queries, expected, strict=True):
                outcomes.append({i for i, _ in store.search(query, 5)} == wanted)
        connections.close_all()

    thread = threading.Thread(target=searcher)
    thread.start()
    try:
        wait_for(lambda: len(outcomes) >= 5)
        with psycopg.connect(database_url(), autocommit=True) as admin:
            before = len(outcomes)
            admin.execute(f"REINDEX INDEX CONCURRENTLY {INDEX}")
            during = len(outcomes) - before
            assert during > 0, "no search ran while the index was rebuilt; add rows"
            admin.execute(f"DROP INDEX CONCURRENTLY {INDEX}")
            wait_for(lambda: len(outcomes) >= before + during + 5)  # no index: exact scans
            admin.execute(
                f"CREATE INDEX CONCURRENTLY {INDEX} ON retrieval_chunk "
                "USING hnsw (embedding vector_ip_ops)"
            )
        wait_for(lambda: len(outcomes) >= before + during + 10)
    finally:
        stop.set()
        thread.join(30)
    assert all(outcomes), f"{outcomes.count(False)} of {len(outcomes)} searches were wrong"


def test_a_process_starting_while_an_ingestion_writes_does_not_wait_for_it(
    pgvector_retriever,
) -> None:
    """Start-up checks the schema without taking a lock that waits for writers."""
    store = pgvector_retriever.vectors
    writer = psycopg.connect(database_url(), autocommit=False)
    try:
        # what an ingestion's open transaction holds on the chunk table
        writer.execute("LOCK TABLE retrieval_chunk IN ROW EXCLUSIVE MODE")
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
        began = time.monotonic()
        PgVectorStore(store.dimension, store.embedding_model)  # another process starting
        assert time.monotonic() - began < 2
    finally:
        writer.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
