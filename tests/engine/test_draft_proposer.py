"""DraftProposer: catching up, proposing, rolling back and freeing the draft model's own KV cache.

The draft here is a FakeRunner: it reads each context back through the block tables it is given,
so a draft cache that kept a rejected draft, lost a block or mixed two sequences up would propose
something other than `reference_completion` of the true tokens.
"""

from __future__ import annotations

import pytest

from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.sequence import Sequence
from inference.engine.draft_proposer import DraftProposer
from tests.engine.fakes import FakeRunner, reference_completion

GREEDY = SamplingParams(temperature=0)


class DraftRunner(FakeRunner):
    """A FakeRunner that refuses an entry without tokens, as ModelRunner does, and records how
    many tokens each entry of each pass ran."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tokens_per_entry: list[list[int]] = []

    def execute(self, entries):
        if any(not entry.token_ids for entry in entries):
            raise ValueError("a batch entry has no tokens to run")
        self.tokens_per_entry.append([len(entry.token_ids) for entry in entries])
        return super().execute(entries)


def decoding(request_id: str, prompt: list[int]) -> Sequence:
    """A sequence as the target sees it when it decodes: everything but the last token computed."""
    seq = Sequence(request_id, prompt, GREEDY)
    seq.num_computed_tokens = len(prompt) - 1
    return seq


def accept(seq: Sequence, drafts: list[int], num_accepted: int, bonus_token: int) -> None:
    """What the engine does after verification: the accepted drafts, then the target's own pick."""
    seq.token_ids.extend([*drafts[:num_accepted], bonus_token])


def other_than(token_id: int) -> int:
    return 3 + (token_id - 3 + 1) % 29


def test_drafts_are_the_draft_models_greedy_continuation():
    proposer = DraftProposer(DraftRunner(block_size=4), 4)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    assert proposer.propose([decoding("a", prompt)], [4]) == [reference_completion(prompt, 4)]


def test_after_a_rejection_the_draft_continues_from_the_accepted_tokens_only():
    runner = DraftRunner(block_size=4)
    proposer = DraftProposer(runner, 4)
    seq = decoding("a", [5, 6, 7, 8, 9, 10, 11])
    [drafts] = proposer.propose([seq], [4])
    # Two drafts accepted, the third rejected: the draft wrote its keys/values, which must not
    # be read as the token that replaced it.
    accept(seq, drafts, 2, other_than(drafts[2]))
    [drafts] = proposer.propose([seq], [4])
    assert drafts == reference_completion(seq.token_ids, 4)
    assert runner.tokens_per_entry[-4] == [1]  # only the target's own pick is new to the draft
    # Everything accepted: the last draft and the bonus token were never run by the draft.
    accept(seq, drafts, 4, 7)
    [drafts] = proposer.propose([seq], [4])
    assert drafts == reference_completion(seq.token_ids, 4)
    assert runner.tokens_per_entry[-4] == [2]
    # Nothing accepted.
    accept(seq, drafts, 0, other_than(drafts[0]))
    [drafts] = proposer.propose([seq], [2])
    assert drafts == reference_completion(seq.token_ids, 2)


def test_tokens_decoded_while_drafting_paused_replace_the_drafts_written_before():
    # Drafting pauses while more sequences decode than speculative_max_num_seqs; the target then
    # decodes one token per step, and the draft's cache still holds its old drafts at those
    # positions.
    proposer = DraftProposer(DraftRunner(block_size=4), 4)
    seq = decoding("a", [5, 6, 7, 8, 9, 10, 11])
    [drafts] = proposer.propose([seq], [4])
    accept(seq, drafts, 0, other_than(drafts[0]))
    seq.token_ids.extend([other_than(drafts[1]), other_than(drafts[2])])
    [drafts] = proposer.propose([seq], [4])
    assert drafts == reference_completion(seq.token_ids, 4)


def test_a_bonus_token_equal_to_a_written_draft_still_gets_a_first_draft():
    # The draft wrote d1, d2; the target verified d1 only (its budget) and then picked d2 itself:
    # every token is in the draft's cache, yet the last one must run again to draft after it.
    proposer = DraftProposer(DraftRunner(block_size=4), 3)
    seq = decoding("a", [5, 6, 7, 8, 9])
    [drafts] = proposer.propose([seq], [3])
    accept(seq, drafts, 1, drafts[1])
    [drafts] = proposer.propose([seq], [3])
    assert drafts == reference_completion(seq.token_ids, 3)


def test_several_sequences_of_different_lengths_are_drafted_together():
    runner = DraftRunner(block_size=4)
    proposer = DraftProposer(runner, 3)
    prompts = [[5, 6, 7], [8] * 9, [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
    seqs = [decoding(f"s{i}", p) for i, p in enumerate(prompts)]
    limits = [3, 1, 2]
    drafts = proposer.propose(seqs, limits)
    assert drafts == [reference_completion(p, n) for p, n in zip(prompts, limits, strict=True)]
    # One catch-up pass, then decode passes for the sequences that still want drafts.
    assert runner.batch_sizes == [3, 2, 1]


def test_a_long_prompt_is_read_in_chunks_before_it_gets_drafts():
    runner = DraftRunner(block_size=4)
    proposer = DraftProposer(runner, 3, max_num_catch_up_tokens=8)
    prompt = list(range(3, 23))  # 20 tokens
    seq = decoding("a", prompt)
    assert proposer.propose([seq], [3]) == [[]]
    assert proposer.propose([seq], [3]) == [[]]
    assert proposer.propose([seq], [3]) == [reference_completion(prompt, 3)]


def test_a_sequence_the_draft_follows_keeps_its_drafts_when_a_long_prompt_arrives():
    proposer = DraftProposer(DraftRunner(block_size=4), 2, max_num_catch_up_tokens=8)
    old = decoding("old", [5, 6, 7])
    proposer.propose([old], [2])
    accept(old, [], 0, 9)
    new = decoding("new", list(range(3, 23)))
    drafts = proposer.propose([new, old], [2, 2])
    assert drafts == [[], reference_completion(old.token_ids, 2)]


def test_no_room_in_the_draft_cache_means_no_drafts_until_blocks_are_freed():
    # 4 blocks of 4 tokens: one 9-token sequence with 3 drafts takes 3 of them.
    proposer = DraftProposer(DraftRunner(num_kv_blocks=4, block_size=4), 3)
    first, second = decoding("a", [5] * 9), decoding("b", [6] * 9)
    drafts = proposer.propose([first, second], [3, 3])
    assert drafts == [reference_completion(first.token_ids, 3), []]
    assert proposer.num_out_of_blocks == 1
    proposer.release("a")
    assert proposer.propose([second], [3]) == [reference_completion(second.token_ids, 3)]


def test_finished_or_preempted_sequences_give_their_blocks_back():
    proposer = DraftProposer(DraftRunner(block_size=4), 2, enable_prefix_caching=False)
    seqs = [decoding("a", [5] * 6), decoding("b", [6] * 10)]
    proposer.propose(seqs, [2, 2])
    assert proposer.kv_usage > 0
    proposer.keep_only(seqs[1:])
    assert set(proposer.states) == {"b"}
    proposer.keep_only([])
    assert proposer.kv_usage == 0
    assert proposer.states == {}


def test_a_prompt_the_draft_has_read_before_comes_from_its_prefix_cache():
    runner = DraftRunner(block_size=4)
    proposer = DraftProposer(runner, 2)
    prompt = list(range(3, 16))  # 13 tokens: 3 full blocks
    proposer.propose([decoding("a", prompt)], [2])
    blocks_of_a = proposer.states["a"].seq.block_table[:3]
    proposer.release("a")
    proposer.propose([decoding("b", prompt)], [2])
    assert runner.tokens_per_entry[-2] == [1]  # the last token: the other 12 were cached
    assert proposer.states["b"].seq.block_table[:3] == blocks_of_a
    assert proposer.states["b"].seq.num_computed_tokens == len(prompt)


def test_drafts_stop_at_the_draft_models_context_length():
    proposer = DraftProposer(DraftRunner(block_size=4, max_model_len=12), 4)
    seq = decoding("a", list(range(3, 13)))  # 10 tokens: drafts at positions 10 and 11 only
    # The last draft is never run by the draft itself, so 3 fit in a 12-token context.
    assert proposer.propose([seq], [4]) == [reference_completion(seq.token_ids, 3)]
    assert proposer.propose([decoding("b", list(range(3, 16)))], [4]) == [[]]


def test_a_failing_draft_model_turns_drafting_off_instead_of_failing():
    runner = DraftRunner(block_size=4)
    runner.num_failures_left = 1
    proposer = DraftProposer(runner, 3)
    seq = decoding("a", [5, 6, 7])
    assert proposer.propose([seq], [3]) == [[]]
    assert not proposer.is_enabled
    assert proposer.kv_usage == 0
    assert proposer.propose([seq], [3]) == [[]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_speculative_tokens": 0}, "num_speculative_tokens must be >= 1"),
        ({"num_speculative_tokens": 2, "max_num_catch_up_tokens": 0}, "max_num_catch_up_tokens"),
    ],
)
def test_bad_proposer_settings_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DraftProposer(DraftRunner(), **kwargs)
