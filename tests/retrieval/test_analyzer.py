"""retrieval.analyzer: the terms BM25 indexes, for Chinese, English and what mixes them."""

from __future__ import annotations

import pytest

from retrieval.analyzer import analyze


def test_an_unspaced_chinese_clause_is_cut_into_words_and_bigrams():
    terms = analyze("KV缓存命中率")
    assert {"kv", "缓存", "命中", "命中率"} <= set(terms)
    assert "缓存命中率" not in terms and "kv缓存命中率" not in terms
    assert set(analyze("缓存命中率")) <= set(terms)  # the query's terms are all the document's


def test_words_missing_from_the_dictionary_still_match_through_bigrams():
    # a made-up product name jieba cannot know
    assert {"卡榭", "服务器"} <= set(analyze("卡榭服务器"))


def test_traditional_characters_read_as_simplified():
    assert {"网络", "软件"} <= set(analyze("網路設定與軟體"))


def test_full_width_forms_read_as_ascii():
    assert analyze("ＡＰＴ　１２３") == ["apt", "123"]
    assert set(analyze("命中率，达到９８．６％")) >= {"命中率", "98.6"}


@pytest.mark.parametrize(
    ("text", "term"),
    [
        ("throughput rose to 0.88 of peak", "0.88"),
        ("start it with --enable-prefix-caching", "enable-prefix-caching"),
        ("run apt-get install", "apt-get"),
        ("edit /etc/fstab as root", "etc/fstab"),
        ("前缀缓存用--enable-prefix-caching打开", "enable-prefix-caching"),
    ],
)
def test_versions_options_and_paths_are_terms_of_their_own_and_their_parts(text, term):
    terms = analyze(text)
    assert term in terms
    assert set(term.replace("/", "-").replace(".", "-").split("-")) - {"0"} <= set(terms)


def test_english_keeps_the_behaviour_it_was_tuned_on():
    assert analyze("The kitchen is cleaned on Fridays.") == ["kitchen", "cleaned", "fridays"]


def test_stopwords_emoji_and_unknown_scripts_never_fail():
    assert analyze("的 了 是") == []
    assert analyze("😀👍") == []
    assert analyze("") == []
    assert analyze("カタカナ テスト") == ["カタカナ", "テスト"]
    assert analyze("Привет мир") == ["привет", "мир"]
