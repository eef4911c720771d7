"""Sequence: the scheduler's view of one request (tokens, KV progress, blocks, timings)."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inference.engine.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inference.engine.core.reusable_spans import BlendPlan, ReusableSpans
    from inference.engine.grammar import GrammarState

_arrival_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(slots=True, eq=False)
class Sequence:
    """One request's tokens and its place in the KV cache.

    `token_ids` holds the prompt followed by every generated token. `num_computed_tokens` of them
    have their keys/values in the cache (blocks listed in `block_table`); the rest are computed by
    the next steps. `num_cached_tokens` is how many prompt tokens the prefix cache supplied the
    first time the sequence was scheduled (what usage reports).
    """

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # NOTE: chained hashes of this sequence's full blocks, computed once and extended as tokens
    # arrive, so the block manager never rehashes a prefix it has already seen.
    block_hashes: list[bytes] = field(default_factory=list)
    # How many leading entries of block_table are registered in (or came from) the prefix cache.
    num_hashed_blocks: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    arrival_index: int = field(default_factory=lambda: next(_arrival_counter))
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    # NOTE: speculative tokens proposed for the next step; not part of token_ids until the model
    # has verified them (the scheduler may trim them to fit its budget and blocks).
    draft_token_ids: list[int] = field(default_factory=list)
    # Where a structured output's grammar stands (params.structured_output); None: free text.
    grammar: GrammarState | None = None
    # Passages of the prompt whose keys/values may be reused (core/chunk_reuse.py), and the
    # blend planned for its first step (None once that step ran).
    reusable: ReusableSpans | None = None
    blend: BlendPlan | None = None
    # Prompt tokens whose keys/values were copied from passages computed on their own.
    num_reused_tokens: int = 0

    def __post_init__(self) -> None:
        self.token_ids = list(self.token_ids)
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int, now: float) -> None:
        self.token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now
