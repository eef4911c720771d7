"""inference.prompts with a tokenizer that has no character offsets (a Python tokenizer)."""

from __future__ import annotations

from transformers.tokenization_python import PythonBackend

from inference.prompts import PromptBuilder

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class CharacterTokenizer(PythonBackend):
    """One token per printable ASCII character: a Python (slow) tokenizer, whose encodings
    carry no offset mapping."""

    def __init__(self, **kwargs) -> None:
        self.vocab = {chr(code): code for code in range(32, 127)} | {"\n": 10}
        super().__init__(**kwargs)
        self.chat_template = CHATML

    @property
    def vocab_size(self) -> int:
        return 128

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return list(text)

    def _convert_token_to_id(self, token: str) -> int:
        return self.vocab.get(token, 0)

    def _convert_id_to_token(self, index: int) -> str:
        return chr(index)


def test_passages_in_a_message_are_named_by_no_span_when_the_tokenizer_has_no_offsets() -> None:
    builder = PromptBuilder(CharacterTokenizer(), "Answer from the passages.", max_model_len=4096)
    passage = "The lamp burned paraffin until 1932."
    message = f"[1] Lighthouses\n{passage}\n\nQuestion: when?"
    start = message.index(passage)

    built = builder.build([], message, max_tokens=64, passages=[(start, start + len(passage))])

    assert built.token_ids == builder.build([], message, max_tokens=64).token_ids
    assert built.passage_spans == [] and built.reusable is None
