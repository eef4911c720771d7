"""GET /healthz names the vector store: pgvector on the bundled PostgreSQL with pgvector."""

from __future__ import annotations

import pytest

from retrieval.ingest import ingest
from retrieval.models import Collection
from tests.documents import KITCHEN, add_document

pytestmark = pytest.mark.django_db


def test_health_reports_the_pgvector_store_its_vectors_and_why(pgvector_retriever, client):
    ingest(
        add_document(Collection.objects.create(name="ops"), "k.txt", KITCHEN).pk, pgvector_retriever
    )
    component = client.get("/healthz").json()["components"]["search_index"]
    assert component["state"] == "ok"
    assert component["detail"] == (
        f"1 vectors of {pgvector_retriever.embedder.model_id} in pgvector: "
        "retrieval_chunk.embedding with HNSW index retrieval_chunk_embedding_hnsw, in PostgreSQL "
        "(PostgreSQL with the vector extension)"
    )
