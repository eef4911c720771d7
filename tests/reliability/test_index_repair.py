"""Faults: the faiss index file corrupted or deleted while the server is stopped.

A real server (LiveServer, embedded defaults) on a data dir with ingested documents is stopped,
its index file damaged, and started again: the start-up check (`retrieval.recovery.check_at_start`
-> `retrieval.consistency.repair_index`) finds it before any search, moves a damaged file aside
and rebuilds the index from the database; search then returns what it returned before.

Three damages: bytes overwritten over the structure (faiss refuses the file), bytes flipped
inside the vector data (faiss reads it; the vectors are no longer unit length), and the file
deleted. The in-process cases (truncation, deletion, damaged vector data, another dimension) are
in tests/retrieval/test_consistency.py and tests/retrieval/test_index.py.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from harness import LiveServer
from tests.reliability.helpers import big_document, index_ids, wait_for

pytestmark = pytest.mark.real_weights

HANDBOOK = (
    "# Handbook\n## Leave\nEvery employee gets thirty days of paid holiday each year.\n"
    "## Travel\nTrains are preferred over flights for trips shorter than 600 kilometres.\n"
)
KITCHEN = "The office kitchen is cleaned every Friday afternoon by the facilities team."
SETUP = f"""
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from api.models import ApiKey
from retrieval.ingest import ingest
from retrieval.models import Collection, Document
from retrieval.search import get_retriever

staff = User.objects.create_user("searcher", is_staff=True)
collection = Collection.objects.create(name="Ops")
for name, content in (("handbook.md", {HANDBOOK!r}), ("kitchen.txt", {KITCHEN!r}),
                      ("records.txt", {big_document(12).decode()!r})):
    document = Document.objects.create(
        collection=collection, title=name, file=ContentFile(content.encode(), name=name)
    )
    ingest(document.pk, get_retriever())
_, key = ApiKey.create_for(staff, "search")
print(key)
"""
QUERIES = (
    "How many days of paid holiday?",
    "When is the kitchen cleaned?",
    "Do we take the train or fly?",
    "What happened to record 7?",
)


def search_all(live: LiveServer, key: str) -> list[list[tuple[int, str, float]]]:
    results = []
    for query in QUERIES:
        request = urllib.request.Request(
            f"{live.url}/v1/search",
            data=json.dumps({"query": query, "top_k": 4}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            hits = json.load(response)["data"]
        results.append([(h["chunk_id"], h["document_title"], h["score"]) for h in hits])
    return results


def assert_same_results(got, expected) -> None:
    for got_hits, expected_hits in zip(got, expected, strict=True):
        assert [h[:2] for h in got_hits] == [h[:2] for h in expected_hits]
        for (_, _, got_score), (_, _, expected_score) in zip(got_hits, expected_hits, strict=True):
            assert got_score == pytest.approx(expected_score, abs=1e-3)


def overwrite_structure(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:64] + bytes(range(256)) * ((len(data) - 64) // 256 + 1))


def flip_vector_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2  # inside the vectors, which make up most of the file
    data[middle : middle + 256] = bytes(b ^ 0x5A for b in data[middle : middle + 256])
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def live(chat_model_dir):
    with LiveServer(models_dir=chat_model_dir.parent, torch_threads=1) as server:
        server.key = server.shell(SETUP).strip()
        server.start()
        server.expected = search_all(server, server.key)
        yield server


@pytest.mark.parametrize(
    "damage", [overwrite_structure, flip_vector_bytes, Path.unlink], ids=lambda d: d.__name__
)
def test_a_damaged_or_deleted_index_is_rebuilt_at_start(live, damage) -> None:
    path = live.data_dir / "index" / "chunks.faiss"
    ids = sorted(index_ids(path))
    live.stop()
    damage(path)
    asides = set(path.parent.glob(f"{path.name}.unusable-*[0-9]"))  # not the records beside
    message = f"embedded {len(ids)} missing chunks" if damage is Path.unlink else "and rebuilding"
    seen = live.log_tail(10**8).count(message)
    live.start()

    # Found and rebuilt by the start-up check, before any search.
    wait_for(lambda: path.exists() and sorted(index_ids(path)) == ids, 120, "the rebuilt index")
    wait_for(lambda: live.log_tail(10**8).count(message) == seen + 1, 30, f"log: {message}")
    if damage is not Path.unlink:
        assert len(set(path.parent.glob(f"{path.name}.unusable-*[0-9]")) - asides) == 1
    assert_same_results(search_all(live, live.key), live.expected)
