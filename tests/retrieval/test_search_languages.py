# ruff: noqa: RUF001 - Chinese text with its full-width punctuation, on purpose
"""Searching a knowledge base of several languages and scripts, as a chat turn searches it: the
real analyzer, embedder, faiss and BM25, and the documents ingested by Cachet's own pipeline."""

from __future__ import annotations

import pytest

from retrieval.ingest import ingest
from retrieval.models import Collection, Document
from retrieval.search import search
from tests.documents import HANDBOOK, KITCHEN, add_document

pytestmark = pytest.mark.django_db

DOCUMENTS = {
    "handbook.md": HANDBOOK,
    "kitchen.txt": KITCHEN,
    "cache.txt": "启用前缀缓存后，KV缓存命中率可以达到98.6%，首字延迟明显下降。",
    "batching.txt": "連續批次處理讓多個請求共享一次前向計算，從而提高吞吐量。",
    "songkran.txt": "สำนักงานปิดทำการในช่วงเทศกาลสงกรานต์ พนักงานทุกคนได้รับวันหยุดพิเศษสามวันในช่วงเทศกาลนี้",
    "server-room.txt": (
        "सर्वर कक्ष की चाबी सुरक्षा डेस्क पर रखी जाती है। रात में प्रवेश के लिए प्रबंधक की अनुमति आवश्यक है।"
    ),
    "party.md": "# 🎉 Team party\nPizza 🍕 and drinks 🍺 on the rooftop terrace, Friday at six.",
}
MODES = ("bm25", "dense", "hybrid", "hybrid+rerank")


@pytest.fixture
def ingested(retriever) -> None:
    collection = Collection.objects.create(name="mixed")
    for name, text in DOCUMENTS.items():
        document = add_document(collection, name, text)
        ingest(document.pk, retriever)
        document.refresh_from_db()
        assert document.status == Document.Status.READY, (name, document.error)


# Each question and the document that answers it: Traditional against Simplified both ways,
# full-width letters, and scripts the analyzer has no rules for (Thai is written without spaces).
QUESTIONS = {
    "快取命中率是多少？": "cache.txt",
    "如何提高吞吐量": "batching.txt",
    "ＫＶ缓存命中率": "cache.txt",
    "วันหยุดสงกรานต์มีกี่วัน": "songkran.txt",
    "सर्वर कक्ष की चाबी कहाँ मिलेगी?": "server-room.txt",
    "how many days of paid holiday": "handbook.md",
}


def test_each_question_finds_its_passage_first_in_every_mode_whatever_its_language(
    ingested,
) -> None:
    for query, title in QUESTIONS.items():
        for mode in MODES:
            hits = search(query, top_k=3, mode=mode)
            assert hits and hits[0].document_title == title, (query, mode, hits)


def test_queries_of_emoji_or_punctuation_alone_never_fail_and_dense_search_answers_them(
    ingested,
) -> None:
    for query in ("😀", "🍕🍺", "？！。", "\u200b"):
        assert search(query, top_k=3, mode="bm25") == []  # no term to match
        for mode in ("dense", "hybrid", "hybrid+rerank"):
            assert len(search(query, top_k=3, mode=mode)) == 3
    assert search("🍕🍺", top_k=1)[0].document_title == "party.md"
