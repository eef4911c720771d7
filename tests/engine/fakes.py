"""Stand-ins for the model runner and tokenizer, so engine behaviour is tested in milliseconds.

FakeRunner keeps a token-id "KV cache" addressed through the block tables it is given, and picks
each next token as a hash of the whole context read back from those blocks. A block manager or
scheduler bug that loses, shares or misplaces cache contents therefore changes the output, which
`reference_completion` (plain Python, no cache) predicts.
"""

from __future__ import annotations

import threading
import time

import torch

EOS_TOKEN_ID = 2
NUM_SPECIAL_TOKENS = 3
VOCAB_SIZE = 32


def next_token(context: list[int]) -> int:
    # NOTE: never a special token, so fake outputs only end on max_tokens or stop conditions.
    return NUM_SPECIAL_TOKENS + hash(tuple(context)) % (VOCAB_SIZE - NUM_SPECIAL_TOKENS)


def reference_completion(prompt: list[int], num_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


class FakeTokenizer:
    eos_token_id = EOS_TOKEN_ID

    def encode(self, text: str) -> list[int]:
        return [NUM_SPECIAL_TOKENS + (ord(c) - ord("a")) % 26 for c in text]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(
            chr(ord("a") + (t - NUM_SPECIAL_TOKENS) % 26)
            for t in token_ids
            if t >= NUM_SPECIAL_TOKENS
        )


class FakeRunner:
    hf_config = None

    def __init__(
        self,
        *,
        num_kv_blocks: int = 64,
        block_size: int = 4,
        max_model_len: int = 64,
        step_delay_s: float = 0.0,
    ):
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = VOCAB_SIZE
        self.step_delay_s = step_delay_s
        self.cache = [[0] * block_size for _ in range(num_kv_blocks)]
        self.num_failures_left = 0
        self.num_steps = 0
        self.batch_sizes: list[int] = []
        self.step_started = threading.Event()

    def execute(self, entries) -> torch.Tensor:
        self.num_steps += 1
        self.batch_sizes.append(len(entries))
        self.step_started.set()
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.num_failures_left:
            self.num_failures_left -= 1
            raise RuntimeError("simulated kernel failure")
        next_tokens = []
        size = self.block_size
        for entry in entries:
            num_tokens = entry.num_computed_tokens + len(entry.token_ids)
            assert len(entry.block_table) * size >= num_tokens
            for offset, token_id in enumerate(entry.token_ids):
                position = entry.num_computed_tokens + offset
                self.cache[entry.block_table[position // size]][position % size] = token_id
            context = [
                self.cache[entry.block_table[p // size]][p % size] for p in range(num_tokens)
            ]
            # NOTE: a speculative entry wants logits after each of its last num_logits tokens.
            for end in range(num_tokens - _num_logits(entry) + 1, num_tokens + 1):
                next_tokens.append(next_token(context[:end]))
        logits = torch.full((len(next_tokens), VOCAB_SIZE), -10.0)
        logits[torch.arange(len(next_tokens)), next_tokens] = 10.0
        return logits


class ScriptedRunner(FakeRunner):
    """Generates `script` token by token after a prompt of `prompt_len` tokens."""

    def __init__(self, script: list[int], prompt_len: int, vocab_size: int, **kwargs):
        super().__init__(**kwargs)
        self.script = script
        self.prompt_len = prompt_len
        self.vocab_size = vocab_size

    def execute(self, entries) -> torch.Tensor:
        self.num_steps += 1
        self.batch_sizes.append(len(entries))
        next_tokens = []
        for entry in entries:
            end = entry.num_computed_tokens + len(entry.token_ids) - self.prompt_len
            for index in range(end - _num_logits(entry) + 1, end + 1):
                next_tokens.append(self.script[min(index, len(self.script) - 1)])
        logits = torch.full((len(next_tokens), self.vocab_size), -10.0)
        logits[torch.arange(len(next_tokens)), next_tokens] = 10.0
        return logits


def _num_logits(entry) -> int:
    return getattr(entry, "num_logits", 1)
