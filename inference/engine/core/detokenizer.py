"""IncrementalDetokenizer: text deltas for one request, safe for split UTF-8 and stop strings.

Text is decoded over a small sliding window of tokens (the vLLM "prefix/read offset" method): the
delta is the difference between decoding the window with and without the newest tokens. A
character whose bytes are split across tokens decodes to U+FFFD until its last byte arrives, so
such a tail is held back rather than emitted. Output that could be the beginning of a stop string
is held back too, until it either completes the stop string (output is cut there) or cannot.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
# NOTE: a few prompt tokens give the first decoded window its context, so tokenizers that drop a
# leading space at the start of a decode (sentencepiece) still produce the right first delta.
NUM_CONTEXT_TOKENS = 5


class Tokenizer(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def fast_decoder(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer's Rust backend when decoding through it gives the same text.

    NOTE: a Hugging Face tokenizer's own `decode` costs ~25 us of Python per call on top of the
    ~5 us Rust decode, and the detokenizer decodes twice per generated token on the engine thread.
    """
    backend: Tokenizer | None = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer
    return backend


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: list[int], stop: tuple[str, ...] = ()
    ):
        self.tokenizer = tokenizer
        self.token_ids = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.prefix_text = self._decode(self.token_ids)
        self.stop = stop
        self.max_stop_len = max((len(s) for s in stop), default=0)
        self.text = ""  # decoded output text, including what is still held back
        self.num_emitted_chars = 0
        self.is_stopped = False  # a stop string was found; the text ends before it

    @property
    def output_text(self) -> str:
        """Everything emitted so far (after the request ends: the whole output text)."""
        return self.text[: self.num_emitted_chars]

    def update(self, token_id: int) -> str:
        """Add one generated token; return the text that can be emitted now (maybe "")."""
        if self.is_stopped:
            return ""
        self.token_ids.append(token_id)
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if len(new_text) <= len(self.prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""  # an incomplete UTF-8 sequence (or nothing visible) so far
        delta = new_text[len(self.prefix_text) :]
        self.prefix_text = self._decode(self.token_ids[self.read_offset :])
        # Slide the window: keep only the tokens still needed for the next decode.
        del self.token_ids[: self.read_offset]
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.text += delta
        return self._emit(len(delta))

    def flush(self) -> str:
        """Emit text held back for stop strings (call when the request ends for another reason)."""
        delta = self.text[self.num_emitted_chars :]
        self.num_emitted_chars = len(self.text)
        return delta

    def _emit(self, num_new_chars: int) -> str:
        if not self.stop:
            return self.flush()
        start = max(0, len(self.text) - num_new_chars - self.max_stop_len + 1)
        found = [index for s in self.stop if (index := self.text.find(s, start)) >= 0]
        if found:
            self.text = self.text[: min(found)]
            self.is_stopped = True
            return self.flush()
        end = len(self.text) - self._num_held_chars()
        delta = self.text[self.num_emitted_chars : end]
        self.num_emitted_chars = max(self.num_emitted_chars, end)
        return delta

    def _num_held_chars(self) -> int:
        """Length of the longest output suffix that is a proper prefix of some stop string."""
        text = self.text
        held = 0
        for stop in self.stop:
            for length in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:length]):
                    held = length
                    break
        return held

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
