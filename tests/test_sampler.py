"""Sampler: greedy, temperature / top-k / top-p, per-request seeds and penalties."""

from __future__ import annotations

import pytest
import torch

from inference.engine.sampler import Sampler, top_k_top_p_candidates
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence

VOCAB_SIZE = 50


def make_seqs(*params: SamplingParams, completion=()) -> list[Sequence]:
    seqs = []
    for index, p in enumerate(params):
        seq = Sequence(f"r{index}", [1, 2, 3], p)
        seq.token_ids.extend(completion)
        seqs.append(seq)
    return seqs


def random_logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB_SIZE, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_take_the_argmax():
    logits = random_logits(3)
    seqs = make_seqs(*[SamplingParams(temperature=0)] * 3)
    assert Sampler()(logits, seqs) == logits.argmax(dim=-1).tolist()


def test_greedy_and_sampled_rows_mix_in_one_batch():
    logits = random_logits(2)
    seqs = make_seqs(SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=3))
    tokens = Sampler()(logits, seqs)
    assert tokens[0] == logits[0].argmax().item()


def test_a_seed_reproduces_the_samples_whatever_shares_the_batch():
    logits = random_logits(4) / 6  # flat enough that samples vary
    seeded = SamplingParams(temperature=1.0, seed=1234)
    alone = Sampler()(logits[1:2], make_seqs(seeded))[0]
    batch = make_seqs(SamplingParams(), seeded, SamplingParams(temperature=0.5), SamplingParams())
    assert Sampler()(logits, batch)[1] == alone
    # A sequence's generator advances step by step, along the same stream for the same seed.
    seqs_a, seqs_b = make_seqs(seeded), make_seqs(seeded)
    stream_a = [Sampler()(logits[1:2], seqs_a)[0] for _ in range(20)]
    stream_b = [Sampler()(logits[1:2], seqs_b)[0] for _ in range(20)]
    assert stream_a == stream_b
    assert len(set(stream_a)) > 1


def test_top_k_one_and_a_tiny_top_p_are_greedy():
    logits = random_logits(2)
    seqs = make_seqs(
        SamplingParams(temperature=2.0, top_k=1), SamplingParams(temperature=2.0, top_p=1e-6)
    )
    for _ in range(5):
        assert Sampler()(logits, seqs) == logits.argmax(dim=-1).tolist()


def test_top_k_and_top_p_keep_only_the_allowed_tokens():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]])).repeat(3, 1)
    probs, token_ids = top_k_top_p_candidates(logits, [2, None, 3], [1.0, 0.7, 0.5])
    allowed = [set(token_ids[row][probs[row] > 0].tolist()) for row in range(3)]
    # Row 2: top-k 3 first, then 0.5 + ... reaches 0.5 after the top token of the top-3 set.
    assert allowed == [{1, 3}, {1, 3}, {1}]


@pytest.mark.parametrize(
    ("last_top_k", "last_top_p", "num_columns"),
    [
        (None, 0.97, 300),  # every nucleus lies in the top 300 (the largest top_k)
        (None, 0.995, 4096),  # one does not: more candidates
        (4500, 0.995, 5000),  # too many for topk to pay off: a full sort
    ],
)
def test_candidate_filtering_matches_a_full_sort(last_top_k, last_top_p, num_columns):
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(1)) * 4
    top_ks, top_ps = [None, 40, 300, last_top_k], [0.9, 1.0, 0.8, last_top_p]
    probs, token_ids = top_k_top_p_candidates(logits, top_ks, top_ps)
    assert probs.shape[1] == num_columns
    for row in range(4):
        sorted_probs, order = torch.softmax(logits[row], -1).sort(descending=True)
        k = top_ks[row] or 5000
        kept = sorted_probs[:k] / sorted_probs[:k].sum()
        num_kept = int(((kept.cumsum(0) - kept) < top_ps[row]).sum()) if top_ps[row] < 1 else k
        assert set(token_ids[row][probs[row] > 0].tolist()) == set(order[:num_kept].tolist())


def test_sampling_follows_the_distribution_roughly():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(2000, 1)
    seqs = make_seqs(*[SamplingParams(temperature=1.0)] * 2000)
    counts = torch.bincount(torch.tensor(Sampler(torch.Generator().manual_seed(0))(logits, seqs)))
    assert 0.6 < counts[0] / 2000 < 0.8


def test_penalties_push_down_generated_tokens():
    logits = torch.zeros(2, VOCAB_SIZE)
    logits[:, 5] = 1.0
    logits[:, 6] = 0.9
    seqs = make_seqs(
        SamplingParams(temperature=0, frequency_penalty=0.2),
        SamplingParams(temperature=0, presence_penalty=0.5),
        completion=[5],
    )
    assert Sampler()(logits, seqs) == [6, 6]
    plain = make_seqs(SamplingParams(temperature=0), completion=[5])
    assert Sampler()(logits[:1], plain) == [5]
