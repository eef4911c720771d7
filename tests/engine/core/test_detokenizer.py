"""IncrementalDetokenizer with the real SmolLM2 tokenizer: split UTF-8 and stop strings."""

from __future__ import annotations

import pytest

from inference.engine.core.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, fast_decoder

PROMPT = "<|im_start|>user\nSay something<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module", params=["hf", "fast"])
def tokenizer(request, chat_model_dir):
    """Each test runs with the Hugging Face tokenizer and with its Rust backend."""
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(str(chat_model_dir))
    if request.param == "hf":
        return hf_tokenizer
    decoder = fast_decoder(hf_tokenizer)
    assert decoder is hf_tokenizer.backend_tokenizer
    return _EncodeWith(hf_tokenizer, decoder)


class _EncodeWith:
    def __init__(self, hf_tokenizer, decoder):
        self.encode = hf_tokenizer.encode
        self.decode = decoder.decode


def stream(tokenizer, text: str, stop=()) -> tuple[list[str], IncrementalDetokenizer]:
    detokenizer = IncrementalDetokenizer(tokenizer, tokenizer.encode(PROMPT), tuple(stop))
    deltas = [detokenizer.update(token_id) for token_id in tokenizer.encode(text)]
    return deltas, detokenizer


@pytest.mark.parametrize(
    "text", ["hi 😀 there", "日本語のテキスト", "emoji 🎉🎉 and ünïcödé, café"]
)
def test_split_utf8_never_emits_a_replacement_char(tokenizer, text):
    token_ids = tokenizer.encode(text)
    # The test is only meaningful if some character really is split across tokens.
    assert any(REPLACEMENT_CHAR in tokenizer.decode([t]) for t in token_ids)
    deltas, detokenizer = stream(tokenizer, text)
    assert all(REPLACEMENT_CHAR not in delta for delta in deltas)
    assert "".join(deltas) == text
    assert detokenizer.output_text == text


def test_stop_string_is_cut_and_never_leaked(tokenizer):
    text = "The answer is 42.\nUser: and then more text"
    deltas, detokenizer = stream(tokenizer, text, stop=["\nUser:"])
    assert "".join(deltas) == "The answer is 42."
    assert detokenizer.is_stopped
    emitted = ""
    for delta in deltas:
        emitted += delta
        assert "\n" not in emitted  # not even the start of the stop string
    assert detokenizer.update(tokenizer.encode("x")[0]) == ""


def test_the_earliest_stop_string_wins(tokenizer):
    deltas, _ = stream(tokenizer, "one two three four", stop=["four", "two"])
    assert "".join(deltas) == "one "


def test_held_back_text_is_released_when_it_is_not_a_stop(tokenizer):
    deltas, detokenizer = stream(tokenizer, "hello world and more", stop=["world!"])
    assert "".join(deltas) == "hello world and more"
    deltas, detokenizer = stream(tokenizer, "hello world", stop=["world!"])
    assert "".join(deltas) == "hello "
    assert detokenizer.flush() == "world"
    assert detokenizer.output_text == "hello world"


def test_a_stop_string_inside_a_split_character_sequence(tokenizer):
    deltas, detokenizer = stream(tokenizer, "ok 😀 done 🎉 after", stop=["🎉"])
    assert "".join(deltas) == "ok 😀 done "
    assert detokenizer.is_stopped
