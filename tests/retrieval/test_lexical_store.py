"""retrieval.lexical_store: which BM25 store a database gets (SQLite here; PostgreSQL's in
test_lexical_postgres.py)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from chatsite.health import run_checks
from retrieval.ingest import ingest
from retrieval.inverted_index import Posting
from retrieval.lexical_store import InProcessLexicalStore, lexical_store_name, make_lexical_store
from retrieval.models import Chunk, Collection
from retrieval.search import search
from tests.documents import HANDBOOK, add_document

pytestmark = pytest.mark.django_db


def test_sqlite_gets_the_in_process_bm25s_store_which_the_retriever_holds(retriever) -> None:
    assert lexical_store_name() == "bm25s"
    assert isinstance(retriever.lexical, InProcessLexicalStore)
    document = add_document(Collection.objects.create(name="hr"), "handbook.md", HANDBOOK)
    ingest(document.pk, retriever)
    assert search("paid holiday", top_k=1, mode="bm25")[0].document_title == "handbook.md"
    assert not Posting.objects.exists()  # SQLite keeps no postings: nothing to keep in step
    detail = run_checks()["components"]["lexical_store"]
    assert detail["state"] == "ok"
    assert detail["detail"] == f"bm25s in this process ({Chunk.objects.count()} chunks)"


def test_the_postgresql_store_is_refused_on_sqlite_with_the_reason() -> None:
    with pytest.raises(ValueError, match="needs a PostgreSQL database"):
        make_lexical_store("postgresql")
    with pytest.raises(ValueError, match="unknown lexical store 'lucene'"):
        make_lexical_store("lucene")
    with pytest.raises(CommandError, match="PostgreSQL only"):
        call_command("backfill_postings")


def test_health_names_the_store_before_the_retriever_is_built(settings) -> None:
    from retrieval import search as search_module

    search_module._retriever = None
    detail = run_checks()["components"]["lexical_store"]["detail"]
    assert detail == "bm25s, not loaded yet in this process"
