"""Large collections' own HNSW indexes in pgvector (retrieval.collection_indexes), on the
bundled PostgreSQL with pgvector: built concurrently, so outside a test transaction."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
from celery.exceptions import Retry
from django.core.management import call_command
from django.db import connection, connections, transaction

import retrieval.collection_indexes as collection_indexes
from retrieval.collection_indexes import index_name, update_collection_indexes
from retrieval.models import Chunk, Collection, Document
from retrieval.pgvector_store import EF_SEARCH, INDEX, PgVectorStore
from retrieval.tasks import index_collection, ingest_document
from tests.documents import HANDBOOK, add_document

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_collection_indexes(pgvector_retriever, transactional_db) -> Iterator[None]:
    """Each test starts without collection indexes: an earlier test's outlive its collections
    (emptying the tables between tests drops no index)."""
    with connection.cursor() as cursor:
        for collection_id in pgvector_retriever.vectors.collections_with_own_index(cursor):
            cursor.execute(f"DROP INDEX {index_name(collection_id)}")
    yield
    with connection.cursor() as cursor:
        for collection_id in pgvector_retriever.vectors.collections_with_own_index(cursor):
            cursor.execute(f"DROP INDEX {index_name(collection_id)}")


def collections_of_sizes(
    store: PgVectorStore, rng: np.random.Generator, sizes: list[int]
) -> tuple[list[Collection], list[np.ndarray], list[np.ndarray]]:
    """One collection per size, its chunks in documents of 50 with random unit vectors:
    (collections, each one's chunk ids, each one's vectors)."""
    collections, ids, vectors = [], [], []
    for number, size in enumerate(sizes):
        collection = Collection.objects.create(name=f"c{number}")
        chunk_ids = []
        for start in range(0, size, 50):
            document = Document.objects.create(
                collection=collection, title=f"d{start}", status=Document.Status.READY
            )
            chunks = Chunk.objects.bulk_create(
                Chunk(
                    document=document,
                    ordinal=i,
                    text=str(i),
                    token_count=1,
                    char_start=0,
                    char_end=1,
                )
                for i in range(min(50, size - start))
            )
            chunk_ids += [c.pk for c in chunks]
        these = rng.standard_normal((size, store.dimension)).astype(np.float32)
        these /= np.linalg.norm(these, axis=1, keepdims=True)
        store.replace([], chunk_ids, these)
        collections.append(collection)
        ids.append(np.array(chunk_ids))
        vectors.append(these)
    return collections, ids, vectors


def plan_of(store: PgVectorStore, query: np.ndarray, collection_ids: list[int]) -> str:
    """EXPLAIN of every query the search runs, one after the other.

    NOTE: at a few hundred chunks sorting the collection's rows is what costs least, and the
    planner rightly takes it; with sorting priced out, the index is used, as at a large scale
    (bench.vector_store reports the plan at a million chunks).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_sort = off")
        store.configure_search(cursor, 10)
        lines = []
        for search in store.search_queries(cursor, query, 10, collection_ids):
            cursor.execute(f"EXPLAIN {search.sql}", search.params)
            lines += [row[0] for row in cursor.fetchall()]
    return "\n".join(lines)


def own_indexes(store: PgVectorStore) -> set[int]:
    with connection.cursor() as cursor:
        return set(store.collections_with_own_index(cursor))


def chunk_collections(ids: list[int]) -> set[int | None]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT collection_id FROM retrieval_chunk WHERE id = ANY(%s)", [ids]
        )
        return {row[0] for row in cursor.fetchall()}


def test_chunks_carry_their_documents_collection_and_follow_a_moved_document(
    pgvector_retriever,
) -> None:
    store = pgvector_retriever.vectors
    (first, second, _), ids, vectors = collections_of_sizes(
        store, np.random.default_rng(1), [120, 60, 100]
    )  # NOTE: the first holds less than half the rows, so its own index serves it
    assert chunk_collections(ids[0].tolist()) == {first.pk}
    assert chunk_collections(ids[1].tolist()) == {second.pk}
    update_collection_indexes(min_rows=100)
    assert own_indexes(store) == {first.pk}

    moved = Document.objects.filter(collection=first).first()
    moved.collection = second
    moved.save()
    moved_ids = list(moved.chunks.values_list("id", flat=True))
    assert chunk_collections(moved_ids) == {second.pk}
    # NOTE: searched through the first collection's own index, which held the moved chunks
    query = vectors[0][ids[0].tolist().index(moved_ids[0])]
    assert index_name(first.pk) in plan_of(store, query, [first.pk])
    found = [i for i, _ in store.search(query, 10, collection_ids=[first.pk])]
    assert not set(found) & set(moved_ids)
    assert store.search(query, 1, collection_ids=[second.pk])[0][0] == moved_ids[0]


def test_a_large_collection_gets_its_own_index_and_a_search_of_it_scans_that_index(
    pgvector_retriever,
) -> None:
    store = pgvector_retriever.vectors
    rng = np.random.default_rng(2)
    collections, ids, vectors = collections_of_sizes(store, rng, [400, 400, 40])
    large, other, small = (c.pk for c in collections)
    done = update_collection_indexes(min_rows=300)
    assert done.built == [large, other] and own_indexes(store) == {large, other}
    assert update_collection_indexes(min_rows=300).built == []  # NOTE: nothing left to do

    query = vectors[0][7] + 0.05 * rng.standard_normal(store.dimension).astype(np.float32)
    query /= np.linalg.norm(query)
    plan = plan_of(store, query, [large])
    assert index_name(large) in plan and f"{INDEX} on" not in plan, plan
    found = [i for i, _ in store.search(query, 10, collection_ids=[large])]
    assert found == ids[0][np.argsort(-(vectors[0] @ query))[:10]].tolist()

    # NOTE: a large and a small collection: the large one's index, the small one read exactly,
    # merged best first
    plan = plan_of(store, query, [large, small])
    assert index_name(large) in plan and index_name(small) not in plan, plan
    found = store.search(query, 10, collection_ids=[large, small])
    pool_ids = np.concatenate([ids[0], ids[2]])
    pool = np.concatenate([vectors[0], vectors[2]])
    assert [i for i, _ in found] == pool_ids[np.argsort(-(pool @ query))[:10]].tolist()
    assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)


def test_collections_searched_through_their_own_indexes_share_the_candidate_list(
    pgvector_retriever,
) -> None:
    store = pgvector_retriever.vectors
    rng = np.random.default_rng(9)
    collections, ids, vectors = collections_of_sizes(store, rng, [200] * 5)
    first, second = collections[0].pk, collections[1].pk
    update_collection_indexes(min_rows=100)
    query = vectors[1][11]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE retrieval_chunk")
        one = store.search_queries(cursor, query, 10, [first])
        two = store.search_queries(cursor, query, 10, [first, second])  # 400 of 1,000 rows
        fifty = store.search_queries(cursor, query, 50, [first, second])
    assert [q.ef_search for q in one] == [EF_SEARCH]
    assert [q.ef_search for q in two] == [EF_SEARCH // 2] * 2
    assert [q.ef_search for q in fifty] == [max(EF_SEARCH // 2, 4 * 50)] * 2  # rows fetched
    found = [i for i, _ in store.search(query, 10, collection_ids=[first, second])]
    pool_ids, pool = np.concatenate(ids[:2]), np.concatenate(vectors[:2])
    assert found == pool_ids[np.argsort(-(pool @ query))[:10]].tolist()


def test_a_failed_build_is_skipped_by_searches_and_built_again_by_the_next_pass(
    pgvector_retriever,
) -> None:
    store = pgvector_retriever.vectors
    (large,), ids, vectors = collections_of_sizes(store, np.random.default_rng(3), [200])
    update_collection_indexes(min_rows=100)
    with connection.cursor() as cursor:
        # NOTE: what a CREATE INDEX CONCURRENTLY that failed leaves behind
        cursor.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass",
            [index_name(large.pk)],
        )
    assert own_indexes(store) == set()
    plan = plan_of(store, vectors[0][0], [large.pk])
    assert index_name(large.pk) not in plan, plan
    assert store.search(vectors[0][0], 1, collection_ids=[large.pk])[0][0] == ids[0][0]
    assert update_collection_indexes(min_rows=100).built == [large.pk]
    assert own_indexes(store) == {large.pk}


def test_a_deleted_or_shrunken_collection_loses_its_index(pgvector_retriever) -> None:
    store = pgvector_retriever.vectors
    (shrinking, deleted), _, _ = collections_of_sizes(store, np.random.default_rng(4), [200, 200])
    update_collection_indexes(min_rows=100)
    assert own_indexes(store) == {shrinking.pk, deleted.pk}
    deleted_id = deleted.pk
    deleted.delete()
    for document in Document.objects.filter(collection=shrinking)[:3]:
        document.delete()  # NOTE: 50 of 200 chunks left, at most half of 100
    done = update_collection_indexes(min_rows=100)
    assert sorted(done.dropped) == sorted([shrinking.pk, deleted_id])
    assert own_indexes(store) == set()


def test_the_task_after_an_ingestion_builds_the_index_and_the_command_reports_it(
    pgvector_retriever, monkeypatch, capsys
) -> None:
    store = pgvector_retriever.vectors
    (first, second), _, _ = collections_of_sizes(store, np.random.default_rng(5), [150, 150])
    monkeypatch.setattr(collection_indexes, "OWN_INDEX_ROWS", 100)
    index_collection(first.pk)
    assert own_indexes(store) == {first.pk}
    call_command("index_collections", "--min-rows", "100")
    assert f"built: [{second.pk}]" in capsys.readouterr().out
    assert own_indexes(store) == {first.pk, second.pk}


def test_a_worker_finding_another_build_under_way_tries_again_later_instead_of_waiting(
    pgvector_retriever, pgvector_database, monkeypatch
) -> None:
    store = pgvector_retriever.vectors
    (large,), _, _ = collections_of_sizes(store, np.random.default_rng(7), [150])
    monkeypatch.setattr(collection_indexes, "OWN_INDEX_ROWS", 100)
    url = pgvector_database.url(connection.settings_dict["NAME"])  # NOTE: locks are per database
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [collection_indexes.BUILD_LOCK_KEY])
        assert update_collection_indexes([large.pk], wait=False) is None
        with pytest.raises(Retry):
            index_collection(large.pk)  # NOTE: called as a worker runs it, not eagerly
        assert own_indexes(store) == set()
        # NOTE: released as a finished build releases it; closing the connection alone frees the
        # lock only once the server notices the session ended, which a fast retry can beat.
        other.execute("SELECT pg_advisory_unlock(%s)", [collection_indexes.BUILD_LOCK_KEY])
    index_collection(large.pk)  # NOTE: the other build is over
    assert own_indexes(store) == {large.pk}


def test_searches_answer_while_a_collection_index_is_being_built(pgvector_retriever) -> None:
    store = pgvector_retriever.vectors
    (large, _), ids, vectors = collections_of_sizes(store, np.random.default_rng(8), [1500, 1500])
    passes = []

    def build() -> None:
        try:
            passes.append(update_collection_indexes([large.pk], min_rows=1000))
        finally:
            connections.close_all()  # NOTE: this thread's own connection

    builder = threading.Thread(target=build)
    builder.start()
    searched = 0
    while builder.is_alive() or searched < 5:
        q = searched % 1500
        found = store.search(vectors[0][q], 10, collection_ids=[large.pk])
        assert len(found) == 10 and found[0][0] == ids[0][q]
        searched += 1
    builder.join()
    assert passes[0].built == [large.pk] and own_indexes(store) == {large.pk}
    assert store.search(vectors[0][7], 1, collection_ids=[large.pk])[0][0] == ids[0][7]


def test_building_inside_a_transaction_is_refused(pgvector_retriever) -> None:
    with transaction.atomic(), pytest.raises(RuntimeError, match="outside a transaction"):
        update_collection_indexes(min_rows=1)


def test_an_ingested_document_that_makes_its_collection_large_gives_it_its_own_index(
    pgvector_retriever, monkeypatch
) -> None:
    monkeypatch.setattr(collection_indexes, "OWN_INDEX_ROWS", 1)
    hr = Collection.objects.create(name="hr")
    result = ingest_document(add_document(hr, "handbook.md", HANDBOOK).pk)
    assert result["status"] == "ready"
    assert Chunk.objects.filter(document__collection=hr).count() > 1
    assert own_indexes(pgvector_retriever.vectors) == {hr.pk}


def test_collections_holding_most_chunks_are_searched_through_the_whole_tables_index(
    pgvector_retriever,
) -> None:
    """A filter admitting most rows costs a graph search little recall, and one query less
    than one per collection."""
    store = pgvector_retriever.vectors
    rng = np.random.default_rng(6)
    collections, ids, vectors = collections_of_sizes(store, rng, [300, 300, 100])
    first, second, _ = (c.pk for c in collections)
    update_collection_indexes(min_rows=200)
    store.exact_rows = 200  # NOTE: as in service, a collection with its own index is too large
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE retrieval_chunk")  # NOTE: what autovacuum does in service
    query = vectors[1][3]
    one = plan_of(store, query, [first])  # 300 of 700: its own index
    assert index_name(first) in one and f"{INDEX} on" not in one, one
    both = plan_of(store, query, [first, second])  # 600 of 700: the whole table's, once
    assert f"{INDEX} on" in both and index_name(first) not in both, both
    assert both.count("Limit") == 2  # NOTE: one query (an inner and an outer LIMIT)
    found = [i for i, _ in store.search(query, 10, collection_ids=[first, second])]
    pool_ids, pool = np.concatenate(ids[:2]), np.concatenate(vectors[:2])
    exact = pool_ids[np.argsort(-(pool @ query))[:10]].tolist()
    assert len(set(found) & set(exact)) >= 9
