"""The lexical analyzer: text -> the terms BM25 indexes, the same for documents and queries.

Chinese is written without spaces, so a whitespace/word-boundary tokenizer keeps a whole clause
(`KV缓存命中率`) as one term that no query ever repeats. Runs of Han characters are therefore
segmented with jieba's search mode (words and their shorter words: 命中率 -> 命中, 命中率); where
jieba cuts a run into single characters (a word missing from its dictionary, such as a product
name), their character bigrams are the terms instead. Measured on eval/debian-reference-zh
(BM25 alone, whole passages): bm25s's own tokenizer 0.675 nDCG@10, jieba 0.899, bigrams alone
0.898, jieba with every bigram as well 0.863 (each match counted twice), jieba with bigrams
for single characters only 0.897 at the best recall@1 (0.798), which is what is used.
Traditional characters are mapped to simplified ones first (zhconv), so 網路設定 finds 网络设置's
passages.

Everything else keeps the behaviour English search was tuned on (bm25s's default: lower-cased
words of two or more word characters, English stopwords), plus compound terms that code,
versions and options are made of: `0.88`, `apt-get`, `enable-prefix-caching` (from
`--enable-prefix-caching`) and `etc/fstab` are terms of their own as well as their parts.
Text is NFKC-normalised first, so full-width letters, digits and punctuation (U+FF21 and
the like) read as their ASCII forms. Scripts without an analyzer here (Japanese kana, Thai,
...) fall back to word-character runs: searchable, if coarsely.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata

import jieba
import zhconv
from bm25s.stopwords import STOPWORDS_EN

logger = logging.getLogger(__name__)

# CJK Unified Ideographs, Extension A, compatibility ideographs, Extensions B-F.
HAN_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef]+")
WORD = re.compile(r"\w\w+")
COMPOUND = re.compile(r"\w+(?:[.\-/:+#]\w+)+")
ENGLISH_STOPWORDS = frozenset(STOPWORDS_EN)
# Function words and question words that say nothing about what a passage is about.
CHINESE_STOPWORDS = frozenset(
    [
        "的",
        "了",
        "是",
        "在",
        "和",
        "与",
        "及",
        "或",
        "也",
        "都",
        "就",
        "而",
        "并",
        "被",
        "把",
        "对",
        "从",
        "向",
        "于",
        "为",
        "以",
        "之",
        "其",
        "这",
        "那",
        "个",
        "吗",
        "呢",
        "吧",
        "啊",
        "么",
        "着",
        "过",
        "地",
        "得",
        "着",
        "将",
        "又",
        "还",
        "很",
        "更",
        "最",
        "所",
        "由",
        "如",
        "该",
        "此",
        "各",
        "每",
        "些",
        "等",
        "即",
        "则",
        "但",
        "却",
        "让",
        "给",
        "用",
        "有",
        "没",
        "不",
        "我",
        "你",
        "他",
        "她",
        "它",
        "们",
        "请",
        "问",
        "能",
        "会",
        "要",
        "想",
        "可以",
        "可能",
        "什么",
        "怎么",
        "怎样",
        "如何",
        "哪些",
        "哪个",
        "哪里",
        "为什么",
        "是否",
        "多少",
        "一个",
        "一些",
        "这个",
        "那个",
        "这些",
        "那些",
        "这样",
        "那样",
        "我们",
        "你们",
        "他们",
        "它们",
        "以及",
        "或者",
        "并且",
        "而且",
        "如果",
        "因为",
        "所以",
        "但是",
        "然后",
        "需要",
        "应该",
        "通过",
        "使用",
        "进行",
        "时候",
        "之后",
        "之前",
        "其中",
        "关于",
        "对于",
        "请问",
        "一下",
        "里面",
        "上面",
        "下面",
    ]
)
_jieba_lock = threading.Lock()
_jieba_ready = False


def analyze(text: str) -> list[str]:
    """The terms of `text`, in order (repeats kept: BM25 counts them)."""
    normalized = unicodedata.normalize("NFKC", text).casefold()
    terms: list[str] = []
    position = 0
    for run in HAN_RUN.finditer(normalized):
        terms += _other_terms(normalized[position : run.start()])
        terms += _han_terms(run.group())
        position = run.end()
    terms += _other_terms(normalized[position:])
    return terms


def _other_terms(text: str) -> list[str]:
    if not text.strip():
        return []
    words = [word for word in WORD.findall(text) if word not in ENGLISH_STOPWORDS]
    return words + COMPOUND.findall(text)


def _han_terms(run: str) -> list[str]:
    simplified = zhconv.convert(run, "zh-cn")
    segmenter = chinese_segmenter()
    terms = [
        word
        for word in segmenter.lcut_for_search(simplified, HMM=True)
        if len(word) > 1 and word not in CHINESE_STOPWORDS
    ]
    # The fallback: consecutive single characters of the exact segmentation are mostly a word
    # jieba does not know (a product or a person's name), cut apart; their bigrams match it.
    single = ""
    for word in [*segmenter.lcut(simplified, HMM=True), ""]:
        if len(word) == 1 and word not in CHINESE_STOPWORDS:
            single += word
            continue
        terms += [single] if len(single) == 1 else _bigrams(single)
        single = ""
    return terms


def _bigrams(text: str) -> list[str]:
    return [text[i : i + 2] for i in range(len(text) - 1)]


def chinese_segmenter() -> jieba.Tokenizer:
    """jieba's default tokenizer, its dictionary loaded (once, ~0.5 s; jieba caches it on disk)."""
    global _jieba_ready
    if not _jieba_ready:
        with _jieba_lock:
            if not _jieba_ready:
                jieba.setLogLevel(logging.WARNING)
                jieba.initialize()
                _jieba_ready = True
    return jieba.dt
