"""NgramProposer: draft tokens for speculative decoding by prompt lookup (no draft model).

A RAG answer often quotes its context: once the last few generated tokens also occur earlier in
the prompt or the output, the tokens that followed them there are a cheap guess for what comes
next. The engine runs the guesses ("drafts") through the model together with the sequence's last
token in one pass, keeps the longest prefix of drafts that equals what the sampler picks at each
position, and takes the sampler's pick at the first mismatch, so the output is exactly what
decoding one token per step gives (see `EngineCore`).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Proposes up to `num_speculative_tokens` drafts from the latest earlier n-gram match.

    The last n tokens (n from `max_n` down to `min_n`) are looked up in everything before them;
    the most recent earlier occurrence wins, and the tokens after it are the drafts.
    """

    def __init__(self, num_speculative_tokens: int, *, min_n: int = 1, max_n: int = 3) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}..{max_n}")
        self.num_speculative_tokens = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, token_ids: list[int], max_num_tokens: int | None = None) -> list[int]:
        """Draft tokens to follow `token_ids` (prompt + output), at most `max_num_tokens`."""
        limit = self.num_speculative_tokens
        if max_num_tokens is not None:
            limit = min(limit, max_num_tokens)
        num_tokens = len(token_ids)
        if limit < 1 or num_tokens <= self.min_n:
            return []
        # NOTE: ~20 us for a 1,500-token context; a Python scan over it costs ~10x that.
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            # Windows that start early enough to be followed by at least one token before the
            # suffix's own last token: starts 0 .. num_tokens - n - 1.
            windows = sliding_window_view(tokens[:-1], n)
            matches = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if matches.size:
                start = int(matches[-1]) + n
                drafts: list[int] = tokens[start : start + limit].tolist()
                return drafts
        return []
