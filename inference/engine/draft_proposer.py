"""DraftProposer: speculative drafts from a small model that shares the target's vocabulary.

The draft model runs as a second `ModelRunner` (same dtype and device as the target) with a paged
KV cache and a `BlockManager` of its own, prefix caching included. Each decoding sequence gets a
shadow `Sequence` in that block manager over the same token ids: its `num_computed_tokens` is how
many of them the draft's cache holds. A proposal first catches up on the tokens the draft has not
seen (the prompt the first time, afterwards the tokens accepted since) in one pass whose last
logits give the first draft, then runs one-token decode steps for the others, every sequence of
the step batched together. Drafts are the draft model's greedy picks.

Rollback is lazy: the keys/values of drafts 1..k-1 that proposing wrote stay in the draft's cache.
At the next proposal the leading ones the target accepted count as computed (compared token by
token with the sequence), the rest are simply written over. Only confirmed tokens are ever hashed
into the draft's prefix cache.

The target accepts a draft only when it equals its own pick at that position (`EngineCore`), so
drafts change how many tokens a step yields, never which. The draft therefore must never fail a
request either: a sequence the draft's cache has no room for gets no drafts, and an error inside
the draft model turns drafting off for the rest of the engine's life (logged), not the requests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from inference.engine.core.block_manager import BlockManager
from inference.engine.core.sequence import Sequence
from inference.engine.model_runner import BatchEntry, ModelRunner

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class DraftState:
    """The draft model's view of one sequence."""

    # Shadow of the target's sequence in the draft's block manager, over the same token list.
    seq: Sequence
    # Drafts whose keys/values the last proposal wrote after seq.num_computed_tokens.
    written_draft_ids: list[int] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class _Proposal:
    """One sequence's share of a proposal in progress."""

    state: DraftState
    num_drafts: int  # drafts wanted this step (0: only catching up on a prompt chunk)
    catch_up_ids: list[int]
    drafts: list[int] = field(default_factory=list)


class DraftProposer:
    """Proposes up to `num_speculative_tokens` greedy drafts per decoding sequence.

    `max_num_catch_up_tokens` bounds the tokens the draft catches up on in one step, so a long
    prompt is taken in chunks (its sequence gets drafts once the draft has read all of it)
    instead of stalling the step.
    """

    def __init__(
        self,
        runner: ModelRunner,
        num_speculative_tokens: int,
        *,
        enable_prefix_caching: bool = True,
        max_num_catch_up_tokens: int = 512,
    ) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        if max_num_catch_up_tokens < 1:
            raise ValueError(f"max_num_catch_up_tokens must be >= 1, got {max_num_catch_up_tokens}")
        self.runner = runner
        self.num_speculative_tokens = num_speculative_tokens
        self.max_num_catch_up_tokens = max_num_catch_up_tokens
        self.block_manager = BlockManager(
            runner.num_kv_blocks, runner.block_size, enable_prefix_caching=enable_prefix_caching
        )
        self.states: dict[str, DraftState] = {}
        self.is_enabled = True
        # How often a sequence got no drafts because the draft's KV cache was full.
        self.num_out_of_blocks = 0

    @property
    def kv_usage(self) -> float:
        """Fraction of the draft's KV blocks held for live sequences."""
        return self.block_manager.usage

    def propose(self, seqs: list[Sequence], max_num_tokens: list[int]) -> list[list[int]]:
        """Drafts to follow each of `seqs` (decoding sequences), at most `max_num_tokens[i]`."""
        if not self.is_enabled:
            return [[] for _ in seqs]
        try:
            return self._propose(seqs, max_num_tokens)
        except Exception:
            # NOTE: drafts are an optimisation; the requests must not pay for a broken draft.
            logger.exception("the draft model failed; speculative decoding is off from now on")
            self.is_enabled = False
            self.release_all()
            return [[] for _ in seqs]

    def keep_only(self, seqs: Iterable[Sequence]) -> None:
        """Free the draft's blocks of every sequence not in `seqs` (finished or preempted)."""
        live_ids = {seq.request_id for seq in seqs}
        for request_id in [r for r in self.states if r not in live_ids]:
            self.release(request_id)

    def release(self, request_id: str) -> None:
        state = self.states.pop(request_id, None)
        if state is not None:
            self.block_manager.free(state.seq)

    def release_all(self) -> None:
        for request_id in list(self.states):
            self.release(request_id)

    def _propose(self, seqs: list[Sequence], max_num_tokens: list[int]) -> list[list[int]]:
        proposals: dict[Sequence, _Proposal] = {}
        budget = self.max_num_catch_up_tokens
        # NOTE: sequences the draft already follows first (a few tokens each), so a new long
        # prompt never takes their turn.
        order = sorted(range(len(seqs)), key=lambda i: seqs[i].request_id not in self.states)
        for index in order:
            seq = seqs[index]
            # NOTE: the last draft is written at position num_tokens + limit - 2.
            num_positions_left = self.runner.max_model_len - seq.num_tokens + 1
            limit = min(max_num_tokens[index], self.num_speculative_tokens, num_positions_left)
            if limit < 1 or budget < 1:
                continue
            proposal = self._prepare(seq, limit, budget)
            if proposal is not None:
                proposals[seq] = proposal
                budget -= len(proposal.catch_up_ids)
        if proposals:
            self._run(list(proposals.values()))
        return [proposals[seq].drafts if seq in proposals else [] for seq in seqs]

    def _prepare(self, seq: Sequence, limit: int, budget: int) -> _Proposal | None:
        """Reconcile the draft's cache with `seq` and reserve its slots; None: no room."""
        state = self.states.get(seq.request_id)
        if state is None:
            shadow = Sequence(seq.request_id, [], seq.params, cache_salt=seq.cache_salt)
            state = self.states[seq.request_id] = DraftState(shadow)
        shadow = state.seq
        shadow.token_ids = seq.token_ids  # NOTE: the same list: appended tokens show up here
        num_computed = shadow.num_computed_tokens
        for token_id in state.written_draft_ids:
            if num_computed >= seq.num_tokens or seq.token_ids[num_computed] != token_id:
                break
            num_computed += 1  # an accepted draft: its keys/values are already in place
        state.written_draft_ids = []
        # At least the last token runs: its logits give the first draft.
        shadow.num_computed_tokens = min(num_computed, seq.num_tokens - 1)
        computed_blocks = []
        if shadow.num_computed_tokens == 0 and not shadow.block_table:
            computed_blocks = self.block_manager.get_computed_blocks(shadow)
        num_cached = len(computed_blocks) * self.block_manager.block_size
        num_catch_up = seq.num_tokens - shadow.num_computed_tokens - num_cached
        num_drafts = limit
        if num_catch_up > budget:
            num_catch_up, num_drafts = budget, 0  # a chunk now, drafts once it has read it all
        num_new_slots = num_catch_up + max(0, num_drafts - 1)
        if self.block_manager.allocate_slots(shadow, num_new_slots, computed_blocks) is None:
            self.num_out_of_blocks += 1
            return None
        shadow.num_computed_tokens += num_cached
        start = shadow.num_computed_tokens
        return _Proposal(state, num_drafts, seq.token_ids[start : start + num_catch_up])

    def _run(self, proposals: list[_Proposal]) -> None:
        """The catch-up pass (which yields the first drafts), then one decode pass per draft."""
        entries = [
            BatchEntry(p.catch_up_ids, p.state.seq.num_computed_tokens, p.state.seq.block_table)
            for p in proposals
        ]
        picks = self.runner.execute(entries).argmax(dim=-1).tolist()
        for proposal, token_id in zip(proposals, picks, strict=True):
            shadow = proposal.state.seq
            shadow.num_computed_tokens += len(proposal.catch_up_ids)
            self.block_manager.cache_full_blocks(shadow)
            if proposal.num_drafts:
                proposal.drafts.append(token_id)
        drafting = [p for p in proposals if p.num_drafts > 1]
        while drafting:
            entries = [
                BatchEntry(
                    [p.drafts[-1]],
                    p.state.seq.num_computed_tokens + len(p.drafts) - 1,
                    p.state.seq.block_table,
                )
                for p in drafting
            ]
            picks = self.runner.execute(entries).argmax(dim=-1).tolist()
            for proposal, token_id in zip(drafting, picks, strict=True):
                proposal.state.written_draft_ids.append(proposal.drafts[-1])
                proposal.drafts.append(token_id)
            drafting = [p for p in drafting if len(p.drafts) < p.num_drafts]
