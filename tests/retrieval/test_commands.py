"""The retrieval management commands: ingest, search and rebuild_index (eval_retrieval has its
own file, test_retrieval_evaluation.py)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from retrieval.models import Chunk, Collection, Document
from tests.documents import HANDBOOK, KITCHEN

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_ingest_takes_files_and_directories_and_reports_failures(retriever, tmp_path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "handbook.md").write_text(HANDBOOK)
    (folder / "ignored.bin").write_bytes(b"\x00")
    (tmp_path / "empty.txt").write_text("")
    out, err = run("ingest", str(folder), str(tmp_path / "empty.txt"), "--collection", "hr")
    assert "1 ingested, 1 failed into 'hr'" in out and "empty" in err
    assert Collection.objects.get().name == "hr"
    assert {d.title: d.status for d in Document.objects.all()} == {
        "handbook.md": "ready",
        "empty.txt": "failed",
    }
    with pytest.raises(CommandError, match="no such file"):
        run("ingest", str(tmp_path / "missing"), "--collection", "hr")


def test_search_prints_ranked_hits_with_citations(retriever, tmp_path) -> None:
    (tmp_path / "handbook.md").write_text(HANDBOOK)
    (tmp_path / "kitchen.txt").write_text(KITCHEN)
    run("ingest", str(tmp_path), "--collection", "hr")
    out, _ = run("search", "paid holiday days", "--top-k", "1", "--collection", "hr")
    assert out.startswith("1. [") and "handbook.md" in out and "Handbook > Leave" in out
    assert run("search", "kitchen", "--mode", "bm25")[0].count("kitchen.txt") == 1
    with pytest.raises(CommandError, match="no such collection: nope"):
        run("search", "kitchen", "--collection", "nope")


def test_rebuild_index_re_embeds_every_ready_chunk(retriever, tmp_path) -> None:
    (tmp_path / "kitchen.txt").write_text(KITCHEN)
    run("ingest", str(tmp_path), "--collection", "ops")
    retriever.vectors.remove(list(retriever.vectors.ids()))
    out, _ = run("rebuild_index")
    assert out.strip() == f"index rebuilt: {Chunk.objects.count()} vectors"
    assert retriever.vectors.ids() == set(Chunk.objects.values_list("id", flat=True))
