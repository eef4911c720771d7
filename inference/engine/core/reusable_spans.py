"""What a prompt says about its passages, and what reusing their keys/values takes (the plan).

Plain data shared by the sequence, the scheduler and the model runner; the planning itself is
core/chunk_reuse.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ReusableSpans:
    """Where a prompt holds passages whose keys/values may be reused.

    `prefix_len`: the prompt's leading tokens every passage's keys/values are computed after
    (the fixed system prompt; 0: none). `spans`: [start, end) token ranges of the passages,
    after `prefix_len`, in order, not overlapping.
    """

    prefix_len: int
    spans: tuple[tuple[int, int], ...]

    def check(self, num_prompt_tokens: int) -> None:
        """ValueError when the spans do not fit a prompt of `num_prompt_tokens` tokens."""
        if not 0 <= self.prefix_len <= num_prompt_tokens:
            raise ValueError(
                f"reusable prefix_len {self.prefix_len} is outside the prompt's "
                f"{num_prompt_tokens} tokens"
            )
        previous_end = self.prefix_len
        for start, end in self.spans:
            if not previous_end <= start < end <= num_prompt_tokens:
                raise ValueError(
                    f"reusable span [{start}, {end}) must lie after the prefix and the span "
                    f"before it, inside the prompt's {num_prompt_tokens} tokens"
                )
            previous_end = end


@dataclass(slots=True)
class BlendRun:
    """One passage's reused keys/values: token slots to copy from, positions to copy to."""

    source_slots: list[int]  # block_id * block_size + offset in the passage's own blocks
    target_positions: list[int]  # positions in the prompt
    position_shift: int  # target position - source position (the keys' re-rotation)


@dataclass(slots=True)
class BlendPlan:
    """What a sequence's blended prefill copies and computes (one step)."""

    runs: list[BlendRun]
    # Blocks the runs copy from, held (ref-counted) until the copy is done (chunk_reuse.release).
    source_block_ids: list[int]
    # Positions computed in the step, ascending; the prompt's last token is always one.
    query_positions: list[int]
    # Passages (token lists, prefix included) that had nothing to reuse: to compute on their own.
    missing: list[list[int]] = field(default_factory=list)
    # Reused positions to recompute as well, chosen when the step runs: those whose keys/values
    # the prompt's context changes most (EngineCore's blend, ModelRunner.kv_deviation).
    num_selected: int = 0

    @property
    def num_reused_tokens(self) -> int:
        return sum(len(run.target_positions) for run in self.runs) - self.num_selected

    @property
    def num_computed_tokens(self) -> int:
        """The tokens the blend's step computes."""
        return len(self.query_positions) + self.num_selected
