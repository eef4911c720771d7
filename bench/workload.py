"""The engine benchmarks' workload: a shared system prompt, a unique user turn per request.

`bench.engine`, `bench.optimization_table` and `bench.api` measure on the same kind of prompts:
deterministic English-like filler of a given token length, a seed per user turn (`Seeds` hands
out fresh ones, so no two measured requests share a user turn and hit the prefix cache).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# A small English vocabulary for deterministic, prompt-like filler text.
WORD_TEXT = """
the of and to in is was for on that with as by at from his her an which or be are this have
not had but were all one their they has been would she there more when its who will team
report quarter customer product release server network policy document meeting plan budget
support access review change process system service data security request update project
design test deploy issue owner manager office travel expense contract invoice holiday
training onboarding laptop account password backup storage database cache latency
"""
WORDS = tuple(WORD_TEXT.split())


@dataclass(slots=True)
class Workload:
    """The sizes of a run: prompt and answer lengths, and the numbers of requests sent at once."""

    system_tokens: int = 1000
    user_tokens: int = 250
    output_tokens: int = 64
    concurrency: tuple[int, ...] = (1, 8, 32)

    @classmethod
    def from_json(cls, fields: dict) -> Workload:
        """The workload a parent handed a child process (asdict(), through JSON)."""
        return cls(**(fields | {"concurrency": tuple(fields["concurrency"])}))


SMOKE = Workload(system_tokens=48, user_tokens=16, output_tokens=4, concurrency=(1, 2))


def text_of_tokens(tokenizer, num_tokens: int, seed: int) -> str:
    """Deterministic English-like text of about `num_tokens` tokens."""
    rng = random.Random(seed)
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < num_tokens:
        words.extend(rng.choice(WORDS) for _ in range(max(8, (num_tokens - len(words)) // 2)))
    ids = tokenizer.encode(" ".join(words), add_special_tokens=False)[:num_tokens]
    return tokenizer.decode(ids)


def build_prompts(
    tokenizer, workload: Workload, num_prompts: int, first_seed: int, *, system_seed: int = 0
) -> list[list[int]]:
    """Chat prompts of one system prompt (the same for every call with `system_seed`) and a
    user turn each, seeded from `first_seed` on."""
    system = text_of_tokens(tokenizer, workload.system_tokens, seed=system_seed)
    prompts = []
    for index in range(num_prompts):
        user = text_of_tokens(tokenizer, workload.user_tokens, seed=first_seed + index)
        if tokenizer.chat_template is None:  # NOTE: a base model: the two parts as plain text
            prompts.append(tokenizer.encode(f"{system}\n\n{user}"))
            continue
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


class Seeds:
    """Hands out fresh user-turn seeds so no two measured requests share a user turn."""

    def __init__(self) -> None:
        self.next_seed = 1

    def take(self, count: int) -> int:
        first, self.next_seed = self.next_seed, self.next_seed + count
        return first
