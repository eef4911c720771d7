"""Sampler: turns a batch of last-token logits into one token id per sequence.

Vectorised over the batch, and only doing work some row needs: an all-greedy batch is a single
argmax. Sampled rows draw one uniform number per step from their request's own
`torch.Generator` (when it has a seed), so a seeded request reproduces whatever shares its batch,
and pick the token by inverse CDF (cumsum + searchsorted) over the batch.

NOTE: top-k / top-p work on the top 256 candidate tokens (torch.topk) rather than a sort of the
whole vocabulary: on CPU, sorting 32 x 49k logits takes ~100 ms per step, topk a few ms. The
result is exact: when a row's nucleus does not fit in the candidates, more are taken, and in the
end the whole vocabulary is sorted.
"""

from __future__ import annotations

import torch

from inference.engine.sequence import Sequence

# NOTE: tried in turn; beyond the last, topk is no cheaper than sorting the whole vocabulary.
CANDIDATE_SIZES = (256, 4096)


class Sampler:
    def __init__(self, generator: torch.Generator | None = None):
        # NOTE: rows without a seed share this generator; a seeded row never touches it.
        self.generator = generator

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Sample one token per row of `logits` [len(seqs), vocab] (float32)."""
        params = [seq.params for seq in seqs]
        if any(p.has_penalties for p in params):
            logits = apply_penalties(logits, seqs)
        if all(p.is_greedy for p in params):
            return logits.argmax(dim=-1).tolist()

        if any(p.is_greedy for p in params):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = torch.empty(len(seqs), dtype=torch.long)
        rows = [row for row, p in enumerate(params) if not p.is_greedy]
        uniforms = self._uniforms([seqs[row] for row in rows])
        is_filtered = [params[row].top_k is not None or params[row].top_p < 1.0 for row in rows]
        for want_filtered in (False, True):
            group = [i for i, flag in enumerate(is_filtered) if flag == want_filtered]
            if not group:
                continue
            group_rows = [rows[i] for i in group]
            group_params = [params[row] for row in group_rows]
            temperatures = torch.tensor([p.temperature for p in group_params], dtype=logits.dtype)
            scaled = logits[group_rows] / temperatures.unsqueeze(1)
            if want_filtered:
                top_ks = [p.top_k for p in group_params]
                top_ps = [p.top_p for p in group_params]
                probs, token_ids = top_k_top_p_candidates(scaled, top_ks, top_ps)
            else:
                probs, token_ids = torch.softmax(scaled, dim=-1), None
            picked = sample_from(probs, uniforms[group])
            if token_ids is not None:
                picked = token_ids.gather(1, picked.unsqueeze(1)).squeeze(1)
            tokens[group_rows] = picked
        return tokens.tolist()

    def _uniforms(self, seqs: list[Sequence]) -> torch.Tensor:
        uniforms = torch.rand(len(seqs), generator=self.generator)
        for index, seq in enumerate(seqs):
            if seq.generator is not None:
                uniforms[index] = torch.rand((), generator=seq.generator)
        return uniforms


def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one index per row of (unnormalised) `probs`."""
    cdf = probs.cumsum(dim=-1)
    targets = uniforms.to(cdf.dtype).unsqueeze(1) * cdf[:, -1:]
    indices = torch.searchsorted(cdf, targets, right=True).squeeze(1)
    return indices.clamp_(max=probs.shape[1] - 1)


def top_k_top_p_candidates(
    scaled_logits: torch.Tensor, top_ks: list[int | None], top_ps: list[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens each row may sample, best first: (probs zeroed outside top-k/top-p, ids).

    Top-p applies after top-k (to the top-k renormalised distribution), as in vLLM.
    """
    vocab_size = scaled_logits.shape[1]
    ks = [min(k, vocab_size) if k is not None else vocab_size for k in top_ks]
    max_k = max([0, *(k for k in ks if k < vocab_size)])
    log_total = torch.logsumexp(scaled_logits, dim=-1, keepdim=True)
    probs = token_ids = None
    for size in CANDIDATE_SIZES:
        num_candidates = max(size, max_k)
        if num_candidates > CANDIDATE_SIZES[-1] or num_candidates >= vocab_size:
            break
        top_logits, token_ids = scaled_logits.topk(num_candidates, dim=-1)
        probs = torch.exp(top_logits - log_total)
        mass = probs.sum(dim=-1).tolist()
        # Complete when each row's top-k set, or its nucleus, lies inside the candidates.
        if all(k <= num_candidates or m >= p for k, p, m in zip(ks, top_ps, mass, strict=True)):
            break
        probs = None
    if probs is None:
        sorted_logits, token_ids = scaled_logits.sort(dim=-1, descending=True)
        probs = torch.exp(sorted_logits - log_total)
    positions = torch.arange(probs.shape[1]).unsqueeze(0)
    k_limits = torch.tensor(ks).unsqueeze(1)
    probs = probs.masked_fill(positions >= k_limits, 0.0)
    if any(p < 1.0 for p in top_ps):
        # NOTE: probs are fractions of the whole vocabulary; only a top-k cut renormalises.
        totals = torch.where(k_limits < vocab_size, probs.sum(dim=-1, keepdim=True), 1.0)
        renormalised = probs / totals
        # NOTE: a token is kept while the mass before it is below p, so the top token always is.
        mass_before = renormalised.cumsum(dim=-1) - renormalised
        ps = torch.tensor([p if p < 1.0 else float("inf") for p in top_ps], dtype=probs.dtype)
        ps = ps.unsqueeze(1)
        probs = probs.masked_fill(mass_before >= ps, 0.0)
    return probs, token_ids


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """OpenAI presence/frequency penalties over each sequence's generated tokens."""
    logits = logits.clone()
    vocab_size = logits.shape[1]
    for row, seq in enumerate(seqs):
        params = seq.params
        if not params.has_penalties or seq.num_completion_tokens == 0:
            continue
        ids = torch.tensor(seq.completion_token_ids, dtype=torch.long)
        counts = torch.bincount(ids, minlength=vocab_size)[:vocab_size].to(logits.dtype)
        logits[row] -= params.frequency_penalty * counts
        logits[row] -= params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits
