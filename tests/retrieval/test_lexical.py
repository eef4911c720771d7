"""retrieval.lexical: BM25 (bm25s) over chunk texts, keyed by chunk id."""

from __future__ import annotations

import numpy as np

from retrieval.lexical import LexicalIndex

TEXTS = {
    11: "The kitchen is cleaned on Fridays.",
    22: "Holiday leave is thirty days per year.",
    33: "Trains are preferred for short trips; the kitchen has a kettle.",
}


def built() -> LexicalIndex:
    index = LexicalIndex()
    index.build(list(TEXTS), list(TEXTS.values()), stamp="s1")
    return index


def test_hits_come_back_as_chunk_ids_best_first_with_positive_scores() -> None:
    hits = built().search("holiday leave days", 5)
    assert hits[0][0] == 22
    assert all(score > 0 for _, score in hits)
    assert {i for i, _ in built().search("kitchen", 5)} == {11, 33}


def test_search_can_be_restricted_to_allowed_ids() -> None:
    assert [i for i, _ in built().search("kitchen", 5, np.array([33]))] == [33]
    assert built().search("kitchen", 5, np.array([22])) == []


def test_queries_of_only_stopwords_or_an_empty_index_find_nothing() -> None:
    assert built().search("the and of", 5) == []
    assert LexicalIndex().search("kitchen", 5) == []
    empty = LexicalIndex()
    empty.build([], [], stamp="empty")
    assert empty.search("kitchen", 5) == [] and empty.stamp == "empty"


def test_the_stamp_records_which_chunk_set_was_indexed() -> None:
    assert built().stamp == "s1"


CHINESE = {
    1: "启用前缀缓存后，KV缓存命中率可以达到98.6%，首字延迟明显下降。",
    2: "连续批处理让多个请求共享一次前向计算，从而提高吞吐量。",
    3: "Speculative decoding drafts tokens with a small model; apt-get installs it.",
}


def test_chinese_queries_find_chinese_passages_by_their_words():
    index = LexicalIndex()
    index.build(list(CHINESE), list(CHINESE.values()))
    assert index.search("缓存命中率是多少？", 3)[0][0] == 1
    assert index.search("如何提高吞吐量", 3)[0][0] == 2
    assert index.search("吞吐量", 3)[0][0] == 2
    assert index.search("apt-get", 3)[0][0] == 3
    assert index.search("快取命中率", 3)[0][0] == 1  # Traditional/Taiwanese wording
