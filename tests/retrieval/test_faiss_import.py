"""manage.py import_faiss_index: a faiss index carried into PostgreSQL's pgvector column."""

from __future__ import annotations

from io import StringIO

import numpy as np
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import retrieval.collection_indexes as collection_indexes
import retrieval.search as search_module
from retrieval.index import VectorIndex
from retrieval.ingest import ingest
from retrieval.models import Chunk, Collection
from retrieval.pgvector_store import PgVectorStore
from tests.documents import HANDBOOK, KITCHEN, add_document

# NOTE: transactional: the import ends by building collection indexes, concurrently
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def faiss_retriever(pgvector_database, fresh_retriever):
    """A deployment on PostgreSQL that still keeps its vectors in the faiss file."""
    return fresh_retriever("faiss")


def run(*args: str) -> str:
    out = StringIO()
    call_command("import_faiss_index", *args, stdout=out)
    return out.getvalue()


def test_the_faiss_vectors_are_carried_into_postgresql_without_re_embedding(
    faiss_retriever, settings, monkeypatch
) -> None:
    monkeypatch.setattr(collection_indexes, "OWN_INDEX_ROWS", 1)
    collection = Collection.objects.create(name="ops")
    ingest(add_document(collection, "handbook.md", HANDBOOK).pk, faiss_retriever)
    ingest(add_document(collection, "kitchen.txt", KITCHEN).pk, faiss_retriever)
    faiss = faiss_retriever.vectors
    assert isinstance(faiss, VectorIndex)
    faiss.replace([], [999_999], faiss_retriever.embedder.encode(["a chunk that is gone"]))
    chunk_ids = set(Chunk.objects.values_list("id", flat=True))
    settings.CACHET_VECTOR_STORE = "auto"
    out = run()
    assert f"imported {len(chunk_ids)} vectors of {faiss.embedding_model}" in out
    assert "1 left out" in out and "0 ready chunks still without a vector" in out
    assert f"collections given an HNSW index of their own: [{collection.pk}]" in out
    store = PgVectorStore(faiss.dimension, faiss.embedding_model)
    assert store.ids() == chunk_ids
    ids, vectors = faiss.items()
    stored = store.vectors_of(ids.tolist())
    for chunk_id, vector in zip(ids.tolist(), vectors, strict=True):
        if chunk_id in chunk_ids:
            np.testing.assert_array_equal(stored[chunk_id], vector)
    # the next start finds every vector in place: nothing to embed, dense search answers
    search_module._retriever = None
    retriever = search_module.get_retriever()
    assert isinstance(retriever.vectors, PgVectorStore)
    assert retriever.vectors.ids() == chunk_ids
    hits = search_module.search("paid holiday", top_k=1, mode="dense")
    assert hits[0].document_title == "handbook.md"
    assert run().startswith(f"imported {len(chunk_ids)} vectors")  # again: the same state


def test_an_index_of_another_embedding_model_is_refused(faiss_retriever, settings) -> None:
    collection = Collection.objects.create(name="ops")
    ingest(add_document(collection, "kitchen.txt", KITCHEN).pk, faiss_retriever)
    other = VectorIndex(
        settings.DATA_DIR / "other.faiss", faiss_retriever.embedder.dimension, "all-MiniLM-L6-v2"
    )
    ids, vectors = faiss_retriever.vectors.items()
    other.reset(ids.tolist(), vectors)
    settings.CACHET_VECTOR_STORE = "pgvector"
    with pytest.raises(CommandError, match="made by the embedding model 'all-MiniLM-L6-v2'"):
        run("--path", str(other.path))
    with pytest.raises(CommandError, match="there is no faiss index"):
        run("--path", str(settings.DATA_DIR / "missing.faiss"))
    assert PgVectorStore(other.dimension, faiss_retriever.embedder.model_id).ids() == set()


def test_a_first_start_on_pgvector_imports_the_faiss_index_it_finds(
    faiss_retriever, fresh_retriever, settings
) -> None:
    collection = Collection.objects.create(name="ops")
    ingest(add_document(collection, "handbook.md", HANDBOOK).pk, faiss_retriever)
    ingest(add_document(collection, "kitchen.txt", KITCHEN).pk, faiss_retriever)
    faiss = faiss_retriever.vectors
    ids, vectors = faiss.items()
    # a vector that embedding the chunk again would not give: found later only if imported
    planted = np.roll(vectors[0], 1)
    faiss.replace([], [int(ids[0])], planted[None, :])
    retriever = fresh_retriever("pgvector")  # the deployment restarted on pgvector
    assert isinstance(retriever.vectors, PgVectorStore)
    assert retriever.vectors.ids() == set(Chunk.objects.values_list("id", flat=True))
    np.testing.assert_array_equal(retriever.vectors.vectors_of([int(ids[0])])[int(ids[0])], planted)
    assert not faiss.path.exists()
    aside = sorted(p.name for p in faiss.path.parent.glob(f"{faiss.path.name}.imported-*"))
    assert len(aside) == 2 and aside[1] == f"{aside[0]}.model"  # with its model record
    # the next start finds vectors in the column and no file: nothing imported again
    assert fresh_retriever("pgvector").vectors.ids() == retriever.vectors.ids()
