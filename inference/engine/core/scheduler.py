"""Scheduler: continuous batching under a per-step token budget, with chunked prefill.

Each step the running sequences are served first (decodes, then unfinished prefill chunks, each
in arrival order), then waiting sequences are admitted first come, first served while the token
budget, `max_num_seqs` and free blocks allow. A prompt longer than the remaining budget is
prefilled in chunks over several steps, so long prompts never stall running decodes.

When the KV cache runs out of blocks, the newest running sequence is preempted by recompute: its
blocks are freed and it goes back to the front of the waiting queue keeping every token it has
generated; when readmitted it prefills prompt + generated tokens again (mostly from the prefix
cache, since its freed blocks keep their hashes). Callers never see an error for it.

Speculative decoding: a decoding sequence may carry draft tokens (`seq.draft_token_ids`, set by
the engine before `schedule()`). It is then scheduled for 1 + drafts tokens, which take budget
and KV slots like any others; drafts are trimmed so that every later decode keeps its token of
budget, and dropped before anyone is preempted for their blocks. After the step only the verified
part counts as computed (`update_from_output`, then `accept_draft_tokens` for the drafts the
sampler agreed with): blocks holding rejected drafts stay allocated to the sequence, are written
over by its next tokens, and are never hashed into the prefix cache before their tokens are final.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from inference.engine.core.block_manager import Block, BlockManager
from inference.engine.core.chunk_reuse import plan_blend, release
from inference.engine.core.reusable_spans import BlendPlan
from inference.engine.core.sequence import FinishReason, Sequence, SequenceStatus

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class SchedulerOutput:
    """What to run this step: sequences and how many of their uncomputed tokens to run."""

    seqs: list[Sequence] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    num_preempted: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunk_reuse_recompute_tokens: int | None = None,
        chunk_reuse_by_deviation: bool = False,
    ):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Chunk-KV reuse (core/chunk_reuse.py): None = off; else the tokens recomputed at the
        # start of every reused passage, or (`chunk_reuse_by_deviation`) as many per passage
        # chosen by how much the prompt's context changes their keys/values.
        self.chunk_reuse_recompute_tokens = chunk_reuse_recompute_tokens
        self.chunk_reuse_by_deviation = chunk_reuse_by_deviation
        # Passages (standalone token lists) a blend found no keys/values for: the engine core
        # computes them on their own after this step (`take_missing_passages`).
        self.missing_passages: list[tuple[list[int], str | None]] = []
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        seq.status = SequenceStatus.WAITING
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: dict[Sequence, int] = {}
        num_preempted = 0
        # NOTE: decodes first so a long prefill chunk can never starve them of budget.
        order = [s for s in self.running if s.num_uncomputed_tokens == 1]
        num_decodes = len(order)
        order += [s for s in self.running if s.num_uncomputed_tokens > 1]
        for index, seq in enumerate(order):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if seq.draft_token_ids:
                # NOTE: drafts only take budget that the decodes after this one do not need.
                num_room = budget - 1 - max(0, num_decodes - index - 1)
                del seq.draft_token_ids[max(0, num_room) :]
            num_new = min(seq.num_uncomputed_tokens + len(seq.draft_token_ids), budget)
            while self.block_manager.allocate_slots(seq, num_new) is None:
                if seq.draft_token_ids:
                    # NOTE: guesses are not worth preempting anyone for; retry without them.
                    num_new -= len(seq.draft_token_ids)
                    seq.draft_token_ids.clear()
                    continue
                victim = max(self.running, key=_arrival)
                budget += scheduled.pop(victim, 0)
                self._preempt(victim)
                num_preempted += 1
                if victim is seq:
                    break
            else:
                scheduled[seq] = num_new
                budget -= num_new

        # NOTE: admitting new work in a step that had to preempt would only thrash the cache.
        while self.waiting and budget > 0 and not num_preempted:
            if len(self.running) >= self.max_num_seqs:
                break
            seq = self.waiting[0]
            computed_blocks = []
            if seq.num_computed_tokens == 0:
                computed_blocks = self.block_manager.get_computed_blocks(seq)
            num_cached = len(computed_blocks) * self.block_manager.block_size
            num_uncached = seq.num_uncomputed_tokens - num_cached
            blend = self._plan_blend(seq, computed_blocks, num_cached)
            if blend is not None and blend.num_computed_tokens > budget:
                # NOTE: a blend runs in one step; admitted now, a chunk would be all this step
                # could give and the blend would be lost. A later step has the room.
                release(self.block_manager, blend)
                break
            # NOTE: a blend computes only its query positions but needs blocks for the whole
            # prompt, which its one step fills.
            num_new = min(num_uncached, budget) if blend is None else num_uncached
            if self.block_manager.allocate_slots(seq, num_new, computed_blocks) is None:
                if blend is None:
                    break
                # NOTE: the held sources plus the whole prompt's blocks may never fit (nothing
                # running to free any): a chunked prefill needs neither, so it is that instead.
                release(self.block_manager, blend)
                blend = None
                num_new = min(num_uncached, budget)
                if self.block_manager.allocate_slots(seq, num_new, computed_blocks) is None:
                    break
            self.waiting.popleft()
            seq.num_computed_tokens += num_cached
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
                seq.num_cached_tokens = min(num_cached, seq.num_prompt_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if blend is not None:
                seq.blend = blend
                seq.num_reused_tokens = blend.num_reused_tokens
                num_new = blend.num_computed_tokens
            scheduled[seq] = num_new
            budget -= num_new

        self.num_preemptions += num_preempted
        return SchedulerOutput(list(scheduled), list(scheduled.values()), num_preempted)

    def _plan_blend(
        self, seq: Sequence, computed_blocks: list[Block], num_cached: int
    ) -> BlendPlan | None:
        """A blended prefill for `seq` (core/chunk_reuse.py) that fits a step's budget, or
        None: prefilled as usual. Passages with nothing to reuse are noted for computing."""
        if (
            self.chunk_reuse_recompute_tokens is None
            or seq.reusable is None
            or seq.num_computed_tokens
            or seq.num_preemptions  # NOTE: its blocks (blended or not) are in the cache now
        ):
            return None
        # NOTE: held while passages are looked up: reading one from the disk tier takes free
        # blocks, which must not be the ones this prompt's own prefix hit found.
        self.block_manager.hold(computed_blocks)
        try:
            plan = plan_blend(
                self.block_manager,
                seq,
                num_cached,
                self.chunk_reuse_recompute_tokens,
                by_deviation=self.chunk_reuse_by_deviation,
            )
        finally:
            self.block_manager.release(computed_blocks)
        if plan is None:
            return None
        self.missing_passages.extend((tokens, seq.cache_salt) for tokens in plan.missing)
        if not plan.runs or plan.num_computed_tokens > self.max_num_batched_tokens:
            release(self.block_manager, plan)
            return None
        return plan

    def take_missing_passages(self) -> list[tuple[list[int], str | None]]:
        """Passages (token lists, cache salt) to compute on their own, taken once."""
        missing, self.missing_passages = self.missing_passages, []
        return missing

    def update_from_output(self, output: SchedulerOutput) -> list[Sequence]:
        """Advance KV progress after the model ran; return sequences that now need a new token.

        A sequence whose prefill is only partly done (a chunk) does not sample this step. Draft
        tokens do not count as computed here: see `accept_draft_tokens`.
        """
        needs_token = []
        for seq, num_tokens in zip(output.seqs, output.num_scheduled_tokens, strict=True):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted while the step ran
            if seq.blend is not None:  # one step computed the whole prompt
                seq.blend = None
                seq.num_computed_tokens = seq.num_tokens
            else:
                seq.num_computed_tokens += num_tokens - len(seq.draft_token_ids)
            self.block_manager.cache_full_blocks(seq)
            if seq.num_computed_tokens == seq.num_tokens:
                needs_token.append(seq)
        return needs_token

    def accept_draft_tokens(self, seq: Sequence, num_accepted: int) -> None:
        """The first `num_accepted` drafts were verified and appended to `seq.token_ids`.

        Their keys/values were written by the verification pass, so they count as computed now,
        and blocks they complete enter the prefix cache (only now are their tokens known).
        """
        if seq.status is not SequenceStatus.RUNNING or not num_accepted:
            return
        seq.num_computed_tokens += num_accepted
        self.block_manager.cache_full_blocks(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Remove `seq` from the queues and free its blocks at once (also used for abort)."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        if seq.blend is not None:  # its step never ran
            release(self.block_manager, seq.blend)
            seq.blend = None
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = time.monotonic()
        del self.requests[seq.request_id]

    def abort(self, request_id: str) -> Sequence | None:
        seq = self.requests.get(request_id)
        if seq is not None:
            self.finish(seq, FinishReason.ABORT)
        return seq

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.draft_token_ids.clear()
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        # NOTE: back in arrival order (usually the front), so the oldest request always moves
        # forward and a preempted one does not lose its turn to newer arrivals.
        index = 0
        while index < len(self.waiting) and self.waiting[index].arrival_index < seq.arrival_index:
            index += 1
        self.waiting.insert(index, seq)
        logger.debug("preempted %s (%d tokens) to free KV blocks", seq.request_id, seq.num_tokens)


def _arrival(seq: Sequence) -> int:
    return seq.arrival_index
