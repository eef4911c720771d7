"""Perplexity of the engine's own model on a token stream: the quality measure of a weight format.

The text is cut into windows of `window` tokens; each window is prefilled in chunks through the
paged KV cache, so later chunks read what earlier ones wrote (a quantized KV cache is exercised
too) and every token after the first of a window is scored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from inference.engine import BatchEntry, ModelRunner


def perplexity(
    runner: ModelRunner, token_ids: list[int], *, window: int = 1024, chunk: int = 256
) -> float:
    """exp(mean negative log-likelihood) of `token_ids` under the runner's model.

    Uses KV blocks 0.. of the runner's cache: call it on a runner no engine is using.
    """
    if len(token_ids) < 2:
        raise ValueError("perplexity needs at least two tokens")
    block_size = runner.block_size
    block_table = list(range(-(-window // block_size)))
    if len(block_table) > runner.num_kv_blocks:
        raise ValueError(
            f"a window of {window} tokens needs {len(block_table)} KV blocks; the runner has "
            f"{runner.num_kv_blocks}"
        )
    total_nll, num_predicted = 0.0, 0
    for start in range(0, len(token_ids) - 1, window):
        window_ids = token_ids[start : start + window]
        for offset in range(0, len(window_ids) - 1, chunk):
            chunk_ids = window_ids[offset : offset + chunk]
            targets = torch.tensor(window_ids[offset + 1 : offset + chunk + 1])
            # NOTE: the logits of every token of the chunk (the last one's target, at the end
            # of a window, is not in the window: it is dropped).
            entry = BatchEntry(chunk_ids, offset, block_table, num_logits=len(chunk_ids))
            logits = runner.execute([entry])[: len(targets)]
            total_nll += F.cross_entropy(logits.cpu(), targets, reduction="sum").item()
            num_predicted += len(targets)
    return math.exp(total_nll / num_predicted)
