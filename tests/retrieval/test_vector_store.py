"""retrieval.vector_store: which store a database gets, and why (SQLite and PostgreSQL without
pgvector keep faiss; the pgvector store itself is tested on the bundled server)."""

from __future__ import annotations

import threading
from io import StringIO

import dj_database_url
import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

from retrieval.index import VectorIndex
from retrieval.vector_store_choice import choose_vector_store, pgvector_problem

pytestmark = pytest.mark.django_db


def test_sqlite_keeps_faiss_and_says_why(retriever, client) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("runs in the default pass (SQLite)")
    choice = choose_vector_store("auto")
    assert (choice.name, choice.reason) == (
        "faiss",
        "pgvector not used: the database is SQLite, not PostgreSQL",
    )
    assert isinstance(retriever.vectors, VectorIndex)
    detail = client.get("/healthz").json()["components"]["search_index"]["detail"]
    assert detail.endswith(f"in faiss: {retriever.vectors.path} ({choice.reason})")
    with pytest.raises(ValueError, match="CACHET_VECTOR_STORE=pgvector, but the database is SQ"):
        choose_vector_store("pgvector")
    with pytest.raises(CommandError, match="but the database is SQLite"):
        call_command("import_faiss_index", stdout=StringIO())


@pytest.mark.integration
def test_postgresql_without_the_vector_extension_keeps_faiss(retriever, client) -> None:
    """The system PostgreSQL of the integration pass (Debian's, no pgvector package)."""
    if connection.vendor != "postgresql":
        pytest.skip("runs in the integration pass (DATABASE_URL=postgres://...)")
    problem = pgvector_problem()
    assert problem is not None and "has no vector extension" in problem
    assert "postgresql-NN-pgvector" in problem
    assert choose_vector_store("auto").name == "faiss"
    assert isinstance(retriever.vectors, VectorIndex)
    detail = client.get("/healthz").json()["components"]["search_index"]["detail"]
    assert f"in faiss: {retriever.vectors.path} (pgvector not used: {problem})" in detail
    with pytest.raises(ValueError, match="has no vector extension"):
        choose_vector_store("pgvector")


def test_a_store_name_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown vector store 'milvus'; expected one of auto"):
        choose_vector_store("milvus")
    assert choose_vector_store("faiss").reason == "CACHET_VECTOR_STORE=faiss"


def test_two_processes_creating_the_vector_extension_at_once_both_take_pgvector(
    bundled_postgres, django_db_blocker
) -> None:
    """Two processes starting together on a database without the extension both create it: the
    one that loses the race must still take pgvector, not fall back to a faiss file of its own."""
    admin = psycopg.connect(bundled_postgres.url(), autocommit=True)
    admin.execute("DROP DATABASE IF EXISTS extension_race")
    admin.execute("CREATE DATABASE extension_race")
    first = psycopg.connect(bundled_postgres.url("extension_race"))
    alias = "extension_race"
    connections.settings[alias] = connections.configure_settings(
        {"default": {}, alias: dj_database_url.parse(bundled_postgres.url("extension_race"))}
    )[alias]
    problems: list[str | None] = []

    def second_process_starts() -> None:
        with django_db_blocker.unblock():
            try:
                problems.append(pgvector_problem(alias))
            finally:
                connections[alias].close()

    try:
        first.execute("CREATE EXTENSION IF NOT EXISTS vector")  # the first one, not committed
        thread = threading.Thread(target=second_process_starts)
        thread.start()
        thread.join(timeout=2.0)  # the second one waits for the first's catalog rows
        first.commit()
        thread.join(timeout=60)
        assert problems == [None]
    finally:
        first.close()
        del connections.settings[alias]
        admin.execute("DROP DATABASE IF EXISTS extension_race WITH (FORCE)")
        admin.close()
