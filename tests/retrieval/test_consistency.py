"""retrieval.consistency: the faiss index and the Chunk table are brought back into step."""

from __future__ import annotations

import pytest
from django.test import Client

import retrieval.search as search_module
from retrieval.consistency import _embed_in_batches, rebuild_index, rebuild_progress, repair_index
from retrieval.ingest import ingest
from retrieval.models import Chunk, Collection
from tests.documents import HANDBOOK, KITCHEN, add_document

pytestmark = pytest.mark.django_db


def ingest_two(retriever) -> set[int]:
    collection = Collection.objects.create(name="ops")
    ingest(add_document(collection, "kitchen.txt", KITCHEN).pk, retriever)
    ingest(add_document(collection, "handbook.md", HANDBOOK).pk, retriever)
    return set(Chunk.objects.values_list("id", flat=True))


def restart() -> search_module.Retriever:
    """What a new process does: build the retriever, which checks and repairs the index."""
    search_module._retriever = None
    return search_module.get_retriever()


def test_a_mismatched_index_is_repaired_and_can_be_rebuilt(retriever) -> None:
    ids = ingest_two(retriever)
    retriever.vectors.remove([min(ids)])
    retriever.vectors.replace([], [999_999], retriever.embedder.encode(["stale"]))
    report = repair_index(retriever)
    assert (report.removed, report.added, report.rebuilt) == (1, 1, False)
    assert retriever.vectors.ids() == ids
    assert rebuild_index(retriever) == len(ids)
    assert retriever.vectors.ids() == ids


def test_a_deleted_index_file_is_rebuilt_at_start_up(retriever) -> None:
    ids = ingest_two(retriever)
    retriever.vectors.path.unlink()
    assert restart().vectors.ids() == ids


def test_a_corrupt_index_file_is_moved_aside_and_rebuilt_at_start_up(retriever) -> None:
    ids = ingest_two(retriever)
    path = retriever.vectors.path
    path.write_bytes(path.read_bytes()[:100])  # truncated, as by a full disk
    fresh = restart()
    assert fresh.vectors.ids() == ids
    assert list(path.parent.glob(f"{path.name}.unusable-*"))
    hits = search_module.search("paid holiday", top_k=1, mode="dense")
    assert hits[0].document_title == "handbook.md"


def test_a_consistent_index_is_left_alone(retriever) -> None:
    ingest_two(retriever)
    stamp = retriever.vectors.path.stat().st_mtime_ns
    assert (repair_index(retriever).removed, repair_index(retriever).added) == (0, 0)
    assert retriever.vectors.path.stat().st_mtime_ns == stamp


def test_damaged_vector_data_is_found_at_start_up_and_rebuilt(retriever) -> None:
    ids = ingest_two(retriever)
    before = [hit.chunk_id for hit in search_module.search("paid holiday", top_k=3, mode="dense")]
    path = retriever.vectors.path
    data = bytearray(path.read_bytes())
    middle = len(data) // 2  # inside the vectors: faiss still reads the file
    data[middle : middle + 64] = bytes(b ^ 0x5A for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))
    fresh = restart()
    assert fresh.vectors.ids() == ids
    assert list(path.parent.glob(f"{path.name}.unusable-*"))
    fresh.vectors.verify()
    after = [hit.chunk_id for hit in search_module.search("paid holiday", top_k=3, mode="dense")]
    assert after == before


def test_switching_the_embedding_model_re_embeds_every_chunk_at_start_up(
    retriever, settings
) -> None:
    settings.CACHET_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
    retriever = restart()
    ids = ingest_two(retriever)
    path = retriever.vectors.path
    assert retriever.vectors.recorded_model() == "all-MiniLM-L6-v2"
    # MiniLM's vectors: a Chinese question about paid holiday misses the English passage.
    hits = search_module.search("带薪假期有多少天?", top_k=1, mode="dense")
    assert "paid holiday" not in hits[0].text
    settings.CACHET_EMBEDDING_MODEL = "multilingual-e5-small"  # both make 384-d vectors
    fresh = restart()
    assert fresh.embedder.model_id == "multilingual-e5-small"
    assert fresh.vectors.recorded_model() == "multilingual-e5-small"
    assert fresh.vectors.ids() == ids and fresh.dense_ready
    assert list(path.parent.glob(f"{path.name}.unusable-*"))
    # The re-embedded vectors are e5's: the Chinese question now finds the English passage.
    hits = search_module.search("带薪假期有多少天?", top_k=1, mode="dense")
    assert "paid holiday" in hits[0].text


def test_a_rebuild_reports_its_progress_while_it_runs(retriever) -> None:
    ids = sorted(ingest_two(retriever))
    batches = _embed_in_batches(retriever, ids)
    assert rebuild_progress() is None
    first_ids, vectors = next(batches)
    running = rebuild_progress()
    assert running is not None
    assert (running.num_embedded, running.num_chunks) == (0, len(ids))
    assert running.embedding_model == retriever.embedder.model_id
    assert f"of {len(ids)} chunks with {retriever.embedder.model_id}" in running.describe()
    health = Client().get("/healthz").json()["components"]["search_index"]["detail"]
    assert health.startswith("rebuilding, searches use BM25 alone until done: embedding 0 of")
    assert first_ids == ids and len(vectors) == len(ids)
    assert list(batches) == []
    assert rebuild_progress() is None


def test_while_the_index_is_rebuilt_searches_rank_by_bm25_alone(retriever) -> None:
    ingest_two(retriever)
    retriever.dense_ready = False
    candidates = retriever.candidates("paid holiday", "hybrid", None)
    assert candidates and all(c.dense_score is None for c in candidates)
    assert all(c.lexical_score is not None for c in candidates)
