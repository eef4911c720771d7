"""Scheduler: token budget, chunked prefill, FCFS admission, preemption and abort (no model)."""

from __future__ import annotations

import pytest

from inference.engine.core.block_manager import BlockManager
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.scheduler import Scheduler
from inference.engine.core.sequence import FinishReason, Sequence, SequenceStatus

BLOCK_SIZE = 4


def make_scheduler(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=32) -> Scheduler:
    manager = BlockManager(num_blocks, BLOCK_SIZE)
    return Scheduler(
        manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
    )


def add(scheduler: Scheduler, request_id: str, num_tokens: int, first_token: int = 0) -> Sequence:
    tokens = list(range(first_token, first_token + num_tokens))
    seq = Sequence(request_id, tokens, SamplingParams(temperature=0))
    scheduler.add(seq)
    return seq


def run_step(scheduler: Scheduler, next_token: int = 7) -> dict[str, int]:
    """Schedule, pretend the model ran, append a token where one was sampled."""
    output = scheduler.schedule()
    for seq in scheduler.update_from_output(output):
        seq.append_token(next_token, now=0.0)
    return {
        seq.request_id: n for seq, n in zip(output.seqs, output.num_scheduled_tokens, strict=True)
    }


def test_prompts_share_the_step_budget_in_arrival_order():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    add(scheduler, "a", 6)
    add(scheduler, "b", 6, first_token=100)
    assert run_step(scheduler) == {"a": 6, "b": 4}


def test_a_long_prompt_is_prefilled_in_chunks_and_samples_only_at_the_end():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    seq = add(scheduler, "long", 20)
    assert run_step(scheduler) == {"long": 8}
    assert run_step(scheduler) == {"long": 8}
    assert seq.num_completion_tokens == 0
    assert run_step(scheduler) == {"long": 4}
    assert seq.num_completion_tokens == 1
    assert run_step(scheduler) == {"long": 1}


def test_decodes_are_scheduled_before_prefill_chunks():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    add(scheduler, "a", 3)
    run_step(scheduler)  # a is now decoding
    add(scheduler, "b", 20, first_token=100)
    assert run_step(scheduler) == {"a": 1, "b": 7}
    # b, mid-prefill, was admitted first, yet a's decode still comes first.
    output = scheduler.schedule()
    assert [s.request_id for s in output.seqs] == ["a", "b"]
    assert output.num_scheduled_tokens == [1, 7]


def test_max_num_seqs_caps_the_running_batch():
    scheduler = make_scheduler(max_num_seqs=2)
    for index in range(3):
        add(scheduler, f"r{index}", 2, first_token=10 * index)
    assert set(run_step(scheduler)) == {"r0", "r1"}
    assert [s.request_id for s in scheduler.waiting] == ["r2"]


def test_prefix_cache_hits_are_counted_once_and_not_scheduled():
    scheduler = make_scheduler()
    first = add(scheduler, "first", 9)
    run_step(scheduler)
    scheduler.finish(first, FinishReason.STOP)
    second = add(scheduler, "second", 10)
    assert run_step(scheduler) == {"second": 2}
    assert second.num_cached_tokens == 8


def test_running_out_of_blocks_preempts_the_newest_and_keeps_its_tokens():
    scheduler = make_scheduler(num_blocks=4, max_num_batched_tokens=64)
    old = add(scheduler, "old", 4)
    new = add(scheduler, "new", 4, first_token=100)
    run_step(scheduler)  # each holds one full block and has one sampled token
    run_step(scheduler)  # each needs a second block: 4 blocks in use
    assert scheduler.block_manager.num_free_blocks == 0
    for _ in range(4):
        run_step(scheduler)
    # "old" needs a third block: "new" is preempted and waits with its generated tokens.
    assert new.status is SequenceStatus.WAITING
    assert new.num_preemptions == 1
    assert new.num_computed_tokens == 0
    assert new.block_table == []
    assert new.num_completion_tokens == 5
    assert scheduler.num_preemptions == 1
    assert old.status is SequenceStatus.RUNNING


def test_a_preempted_sequence_comes_back_before_newer_requests():
    scheduler = make_scheduler(num_blocks=4, max_num_batched_tokens=64)
    add(scheduler, "old", 4)
    new = add(scheduler, "new", 4, first_token=100)
    for _ in range(6):
        run_step(scheduler)
    assert new.status is SequenceStatus.WAITING
    add(scheduler, "newest", 2, first_token=200)
    assert [s.request_id for s in scheduler.waiting] == ["new", "newest"]


def test_preemption_returns_the_budget_of_a_victim_scheduled_earlier_in_the_step():
    scheduler = make_scheduler(num_blocks=3, max_num_batched_tokens=64)
    old = add(scheduler, "old", 3)
    new = add(scheduler, "new", 3, first_token=100)
    run_step(scheduler)
    # "new" decodes first (room in its block); "old" then needs two more blocks, only one is
    # free, so "new" is preempted although already scheduled this step.
    old.token_ids.extend([1, 2, 3, 4, 5])
    output = scheduler.schedule()
    assert new.status is SequenceStatus.WAITING
    assert [s.request_id for s in output.seqs] == ["old"]
    assert output.num_preempted == 1


def test_a_lone_sequence_always_fits_again_after_preempting_itself():
    scheduler = make_scheduler(num_blocks=2, max_num_batched_tokens=64)
    seq = add(scheduler, "only", 4)
    other = add(scheduler, "other", 4, first_token=100)
    run_step(scheduler)
    scheduler.finish(other, FinishReason.ABORT)
    for _ in range(4):
        run_step(scheduler)
    assert seq.status is SequenceStatus.RUNNING
    assert seq.num_computed_tokens == seq.num_tokens - 1


def test_abort_frees_blocks_at_once_from_running_or_waiting():
    scheduler = make_scheduler(max_num_seqs=1)
    add(scheduler, "running", 9)
    add(scheduler, "waiting", 9, first_token=100)
    run_step(scheduler)
    assert scheduler.block_manager.usage > 0
    aborted = scheduler.abort("running")
    assert aborted.finish_reason is FinishReason.ABORT
    assert scheduler.block_manager.usage == 0
    scheduler.abort("waiting")
    assert not scheduler.has_work
    assert scheduler.abort("unknown") is None


def test_a_sequence_aborted_during_the_step_is_not_advanced():
    scheduler = make_scheduler()
    seq = add(scheduler, "a", 5)
    output = scheduler.schedule()
    scheduler.abort("a")
    assert scheduler.update_from_output(output) == []
    assert seq.num_computed_tokens == 0


def test_duplicate_request_ids_are_rejected():
    scheduler = make_scheduler()
    add(scheduler, "same", 2)
    with pytest.raises(ValueError, match="already in use"):
        add(scheduler, "same", 2)
