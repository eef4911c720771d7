"""Scheduling blended prefills (core/chunk_reuse.py) when KV blocks are short (no model)."""

from __future__ import annotations

from inference.engine.core.block_manager import BlockManager
from inference.engine.core.reusable_spans import ReusableSpans
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.scheduler import Scheduler
from inference.engine.core.sequence import FinishReason, Sequence

BLOCK_SIZE = 4
PREFIX = [100, 101, 102, 103]
PASSAGE = list(range(200, 208))


def make_scheduler(num_blocks: int) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, BLOCK_SIZE),
        max_num_seqs=8,
        max_num_batched_tokens=64,
        chunk_reuse_recompute_tokens=0,
    )


def compute_alone(scheduler: Scheduler, tokens: list[int]) -> None:
    """Run `tokens` as a request of its own (pretending the model ran), then finish it: its
    full blocks stay in the prefix cache, free."""
    seq = Sequence("alone", tokens, SamplingParams(temperature=0))
    scheduler.add(seq)
    output = scheduler.schedule()
    assert output.seqs == [seq]
    scheduler.update_from_output(output)
    scheduler.finish(seq, FinishReason.LENGTH)


def test_a_blend_whose_sources_and_prompt_do_not_fit_together_is_prefilled_as_usual() -> None:
    scheduler = make_scheduler(num_blocks=8)
    compute_alone(scheduler, PREFIX + PASSAGE)  # its prefix and first passage block: reusable
    filler, tail = list(range(300, 308)), list(range(400, 410))
    tokens = PREFIX + filler + PASSAGE + tail  # 30 tokens: all 8 blocks
    start = len(PREFIX + filler)
    seq = Sequence("q", tokens, SamplingParams(temperature=0))
    seq.reusable = ReusableSpans(len(PREFIX), ((start, start + len(PASSAGE)),))
    scheduler.add(seq)

    output = scheduler.schedule()

    # Holding the passage's blocks to copy from leaves 6 free blocks for the 7 new ones the
    # blend needs; prefilling as usual fits (the prefix block is the prompt's own hit).
    assert output.seqs == [seq]
    assert seq.blend is None
    assert output.num_scheduled_tokens == [len(tokens) - len(PREFIX)]
    manager = scheduler.block_manager
    assert all(manager.blocks[i].ref_count == 1 for i in seq.block_table)
    assert manager.num_free_blocks == 0


def test_only_passages_that_could_be_reused_are_queued_to_be_computed_on_their_own() -> None:
    scheduler = make_scheduler(num_blocks=32)
    short, long = list(range(500, 504)), list(range(600, 605))
    tokens = [*PREFIX, 300, 301, *short, 302, *long, 400, 401]
    seq = Sequence("q", tokens, SamplingParams(temperature=0))
    short_start = len(PREFIX) + 2
    long_start = short_start + len(short) + 1
    seq.reusable = ReusableSpans(
        len(PREFIX),
        ((short_start, short_start + len(short)), (long_start, long_start + len(long))),
    )
    scheduler.add(seq)

    scheduler.schedule()

    # Computed alone, the short passage's only full block is the prefix (a sequence's last
    # token is never cached): it could never be reused, so computing it would be wasted.
    assert scheduler.take_missing_passages() == [(PREFIX + long, None)]


def test_a_blend_that_does_not_fit_what_is_left_of_a_step_waits_for_the_next_step() -> None:
    scheduler = make_scheduler(num_blocks=32)
    scheduler.max_num_batched_tokens = 32
    compute_alone(scheduler, PREFIX + PASSAGE)
    other = Sequence("other", list(range(700, 728)), SamplingParams(temperature=0))
    scheduler.add(other)
    filler, tail = list(range(300, 308)), list(range(400, 410))
    tokens = PREFIX + filler + PASSAGE + tail
    start = len(PREFIX + filler)
    seq = Sequence("q", tokens, SamplingParams(temperature=0))
    seq.reusable = ReusableSpans(len(PREFIX), ((start, start + len(PASSAGE)),))
    scheduler.add(seq)

    first = scheduler.schedule()  # "other" leaves 4 tokens of budget: the blend needs 22
    for sampled in scheduler.update_from_output(first):
        sampled.append_token(7, now=0.0)
    second = scheduler.schedule()

    assert first.seqs == [other]
    assert second.seqs == [other, seq]
    assert seq.num_reused_tokens == 4  # the passage's block computed alone, copied
    assert second.num_scheduled_tokens == [1, len(tokens) - len(PREFIX) - 4]


def test_a_passage_whose_cached_tail_was_evicted_is_computed_on_its_own_again() -> None:
    scheduler = make_scheduler(num_blocks=16)
    passage = list(range(200, 212))
    compute_alone(scheduler, PREFIX + passage)  # 4 cached blocks, the prefix's first
    manager = scheduler.block_manager
    # Another sequence takes every free block that holds no cached prefix, then the two least
    # recently used cached ones: the passage's last two blocks (freed tail first).
    taker = Sequence("taker", list(range(900, 900 + 14 * BLOCK_SIZE)), SamplingParams())
    assert manager.allocate_slots(taker, 14 * BLOCK_SIZE) is not None
    filler = [300, 301]
    tokens = PREFIX + filler + passage + [400]
    start = len(PREFIX + filler)
    seq = Sequence("q", tokens, SamplingParams(temperature=0))
    seq.reusable = ReusableSpans(len(PREFIX), ((start, start + len(passage)),))
    scheduler.add(seq)
    manager.free(taker)

    scheduler.schedule()

    assert seq.num_reused_tokens == 4  # what is left of it: its first block after the prefix
    assert scheduler.take_missing_passages() == [(PREFIX + passage, None)]


def test_a_blend_by_deviation_recomputes_no_leading_tokens_but_counts_those_it_will_choose() -> (
    None
):
    scheduler = make_scheduler(num_blocks=32)
    scheduler.chunk_reuse_recompute_tokens = 2
    scheduler.chunk_reuse_by_deviation = True
    compute_alone(scheduler, PREFIX + PASSAGE)  # its first block is reusable
    filler, tail = [300, 301, 302, 303], [400, 401, 402]
    tokens = PREFIX + filler + PASSAGE + tail
    start = len(PREFIX + filler)
    seq = Sequence("q", tokens, SamplingParams(temperature=0))
    seq.reusable = ReusableSpans(len(PREFIX), ((start, start + len(PASSAGE)),))
    scheduler.add(seq)

    output = scheduler.schedule()

    plan = seq.blend
    assert plan is not None and plan.num_selected == 2
    # The reusable block is copied whole, its leading tokens included; 2 of its tokens are
    # chosen to be computed again when the step runs.
    reused = [p for run in plan.runs for p in run.target_positions]
    assert reused == list(range(start, start + BLOCK_SIZE))
    assert not set(reused) & set(plan.query_positions)
    assert plan.num_reused_tokens == BLOCK_SIZE - 2
    assert plan.num_computed_tokens == len(plan.query_positions) + 2
    assert output.num_scheduled_tokens == [plan.num_computed_tokens]
