"""Logits of every position of two sequences, from our engine and from transformers.

`engine_logits` runs them through ModelRunner and the paged KV cache in a schedule that takes
each path attention has: a prompt prefilled in two chunks (the second reading the first from
the cache), a second prompt whose first 72 tokens hit the first's cached blocks, a step mixing
a decode with that prefill, and steps of two decodes with different contexts sharing 9 blocks
(the shared-prefix cascade, CASCADE_MIN_SHARED_TOKENS = 64). The sequences (100 and 90 tokens)
reach far past the tiny models' sliding window (24). Logits come back for every token run (the
runner's `num_logits`), so every position is compared, prefill and decode.
"""

from __future__ import annotations

from pathlib import Path

import torch

from inference.engine import BatchEntry, EngineConfig, ModelRunner

BLOCK_SIZE = 8
LENGTH_A, LENGTH_B = 100, 90
NUM_SHARED = 72  # B's prefix that is A's (9 full blocks)
FIRST_CHUNK_END, SECOND_CHUNK_END = 30, 80  # A's prefill chunks: [0, 30) and [30, 80)
B_CHUNK_END = 85  # B's prefill after the hit: [72, 85)


def token_sequences(vocab_size: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Sequence A and sequence B, B starting with A's first NUM_SHARED tokens."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randint(0, vocab_size, (LENGTH_A,), generator=generator).tolist()
    b_tail = torch.randint(0, vocab_size, (LENGTH_B - NUM_SHARED,), generator=generator).tolist()
    return a, a[:NUM_SHARED] + b_tail


def engine_logits(
    model_dir: Path, a: list[int], b: list[int], **config: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [LENGTH_A, vocab] of all of A and [LENGTH_B - NUM_SHARED, vocab] of B's tokens
    after the shared prefix (the positions B itself runs), float32 unless `config` says."""
    settings: dict[str, object] = {
        "dtype": "float32",
        "kv_cache_mb": 2,
        "block_size": BLOCK_SIZE,
        "max_model_len": 128,
    }
    runner = ModelRunner(EngineConfig(model_dir, **(settings | config)))
    table_a = list(range(13))  # 104 tokens
    table_b = [*table_a[: NUM_SHARED // BLOCK_SIZE], 13, 14, 15]

    def prefill(tokens: list[int], start: int, end: int, table: list[int]) -> BatchEntry:
        return BatchEntry(tokens[start:end], start, table, num_logits=end - start)

    rows_a = [
        runner.execute([prefill(a, 0, FIRST_CHUNK_END, table_a)]),
        runner.execute([prefill(a, FIRST_CHUNK_END, SECOND_CHUNK_END, table_a)]),
    ]
    # a decode of A beside B's prefill after its prefix-cache hit (given in the other order:
    # the runner puts decodes first)
    step = runner.execute(
        [
            prefill(b, NUM_SHARED, B_CHUNK_END, table_b),
            BatchEntry([a[SECOND_CHUNK_END]], SECOND_CHUNK_END, table_a),
        ]
    )
    rows_b = [step[: B_CHUNK_END - NUM_SHARED]]
    rows_a.append(step[B_CHUNK_END - NUM_SHARED :])
    for offset in range(1, LENGTH_A - SECOND_CHUNK_END):
        position_a, position_b = SECOND_CHUNK_END + offset, B_CHUNK_END + offset - 1
        entries = [BatchEntry([a[position_a]], position_a, table_a)]
        if position_b < LENGTH_B:
            entries.append(BatchEntry([b[position_b]], position_b, table_b))
        step = runner.execute(entries)
        rows_a.append(step[:1])
        rows_b.append(step[1:])
    return torch.cat(rows_a), torch.cat(rows_b)


def transformers_logits(
    model_dir: Path, a: list[int], b: list[int], dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' own (eager) logits at the positions `engine_logits` returns."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="eager"
    )
    with torch.inference_mode():
        logits_a = model(torch.tensor([a])).logits[0].float()
        logits_b = model(torch.tensor([b])).logits[0, NUM_SHARED:].float()
    return logits_a, logits_b
