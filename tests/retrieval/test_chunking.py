"""retrieval.chunking: token-aware chunks within heading and paragraph boundaries."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from retrieval.chunking import chunk_sections, document_text
from retrieval.extract import Section


@pytest.fixture(scope="module")
def tokenizer(embedding_model_dir):
    return AutoTokenizer.from_pretrained(str(embedding_model_dir))


def count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_short_paragraphs_of_one_section_share_a_chunk(tokenizer) -> None:
    sections = [Section("One.\n\nTwo.", None, ["A"]), Section("Three.", 2, ["B"])]
    chunks = chunk_sections(sections, tokenizer, 64, 8)
    assert [(c.text, c.page, c.heading_path) for c in chunks] == [
        ("One.\n\nTwo.", None, ["A"]),
        ("Three.", 2, ["B"]),
    ]


def test_chunks_never_exceed_the_token_budget_and_spans_point_into_the_text(tokenizer) -> None:
    paragraph = " ".join(f"Sentence number {i} talks about topic {i}." for i in range(40))
    sections = [Section("Intro line.", None, []), Section(f"{paragraph}\n\n{paragraph}", 3, ["H"])]
    chunks = chunk_sections(sections, tokenizer, 48, 10)
    full = document_text(sections)
    assert len(chunks) > 4
    for chunk in chunks:
        assert chunk.token_count <= 48
        assert full[chunk.char_start : chunk.char_end] == chunk.text
        assert count(tokenizer, chunk.text) <= 48 + 2  # joining units may merge a token or two


def test_consecutive_chunks_overlap_by_whole_sentences(tokenizer) -> None:
    text = " ".join(f"Fact {i} is stated here." for i in range(30))
    chunks = chunk_sections([Section(text)], tokenizer, 40, 12)
    assert chunks[1].char_start < chunks[0].char_end
    assert text[chunks[1].char_start : chunks[0].char_end].strip().startswith("Fact")


def test_a_single_overlong_word_run_is_cut_at_token_boundaries(tokenizer) -> None:
    text = "x" * 2000
    chunks = chunk_sections([Section(text)], tokenizer, 32, 0)
    assert all(c.token_count <= 32 for c in chunks)
    assert "".join(c.text for c in chunks) == text


def test_bad_sizes_are_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="overlap"):
        chunk_sections([Section("a")], tokenizer, 32, 16)
    with pytest.raises(ValueError, match="max_tokens"):
        chunk_sections([Section("a")], tokenizer, 8, 0)
