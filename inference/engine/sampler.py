"""Sampler: turns rows of logits into token ids, one per row.

Vectorised over the batch, and only doing work some row needs: an all-greedy batch is a single
argmax. Sampled rows use the Gumbel-max trick: the token is argmax(logits / T + g), where the
noise g of every token is a fixed function of the request's seed, the token's output position
and the token id (a counter-based hash, `gumbel_noise`). So a seeded request's tokens are a
function of its own logits only:

- reproducible whatever shares its batch. Batch composition moves the logits by ~1e-5; with
  Gumbel-max that changes a pick only when two tokens' noisy scores tie within 1e-5, where the
  old inverse-CDF draw (one uniform, cumsum + searchsorted) flipped whenever the uniform fell near
  any moved CDF boundary (about 1 in 80 seeded answers under load);
- the same whether a position is sampled alone or inside a speculative verification pass, which
  is what makes speculative decoding lossless for sampled requests too.

Rows without a seed key their noise with random keys drawn from the sampler's shared generator.

Rows of a request with a structured output (`seq.grammar`, grammar.py) first have the tokens their
grammar forbids masked to -inf, so every rule below only ever picks an allowed token, and a greedy
row keeps the model's own choice whenever that choice is allowed.

NOTE: top-k / top-p work on the top 256 candidate tokens (torch.topk) rather than a sort of the
whole vocabulary: on CPU, sorting 32 x 49k logits takes ~100 ms per step, topk a few ms. The
result is exact: when a row's nucleus does not fit in the candidates, more are taken, and in the
end the whole vocabulary is sorted. Noise is then hashed for the candidates only.
"""

from __future__ import annotations

import torch

from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.sequence import Sequence
from inference.engine.grammar import apply_bitmask

# NOTE: tried in turn; beyond the last, topk is no cheaper than sorting the whole vocabulary.
CANDIDATE_SIZES = (256, 4096)
_MASK64 = (1 << 64) - 1
# lowbias32 (C. Wellons' hash prospector), a 32-bit bijection with near-ideal avalanche; its
# constants as int32 so the multiplications wrap in int32 tensors.
_HASH_MUL_1 = 0x7FEB352D
_HASH_MUL_2 = 0x846CA68B - (1 << 32)
_NOISE_BITS = 23
NOISE_ROWS_PER_CHUNK = 4


class Sampler:
    def __init__(self, generator: torch.Generator | None = None):
        # NOTE: rows without a seed draw their noise keys from this generator; seeded rows never
        # touch it.
        self.generator = generator
        # Reused between steps: one int32 word per 32 vocabulary ids per row.
        self._bitmask: torch.Tensor | None = None

    def __call__(
        self, logits: torch.Tensor, seqs: list[Sequence], num_logits: list[int] | None = None
    ) -> list[int]:
        """Sample one token per row of `logits` (float32).

        Without `num_logits`, row i belongs to seqs[i] and samples its next token. With it,
        seqs[i] owns the next num_logits[i] rows: row j of them samples the token at output
        position num_completion_tokens + j, as if the first j of `seq.draft_token_ids` had been
        accepted (speculative verification; penalties then count those drafts as generated).
        """
        if num_logits is None:
            row_seqs, offsets = seqs, [0] * len(seqs)
        else:
            row_seqs = [seq for seq, n in zip(seqs, num_logits, strict=True) for _ in range(n)]
            offsets = [j for n in num_logits for j in range(n)]
        params = [seq.params for seq in row_seqs]
        constrained_rows = [row for row, seq in enumerate(row_seqs) if seq.grammar is not None]
        if constrained_rows:
            self._mask_by_grammar(logits, row_seqs, constrained_rows)
        if any(p.has_penalties for p in params):
            logits = apply_penalties(logits, row_seqs, offsets)
        if all(p.is_greedy for p in params):
            return logits.argmax(dim=-1).tolist()

        if any(p.is_greedy for p in params):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = torch.empty(len(row_seqs), dtype=torch.long, device=logits.device)
        rows = [row for row, p in enumerate(params) if not p.is_greedy]
        keys = self._noise_keys(
            [params[row].seed for row in rows],
            [row_seqs[row].num_completion_tokens + offsets[row] for row in rows],
            logits.device,
        )
        is_filtered = [params[row].top_k is not None or params[row].top_p < 1.0 for row in rows]
        for want_filtered in (False, True):
            group = [i for i, flag in enumerate(is_filtered) if flag == want_filtered]
            if not group:
                continue
            group_rows = [rows[i] for i in group]
            group_params = [params[row] for row in group_rows]
            group_keys = keys[group] if len(group) < len(rows) else keys
            temperatures = torch.tensor(
                [p.temperature for p in group_params], dtype=logits.dtype, device=logits.device
            )
            group_logits = logits if len(group_rows) == len(logits) else logits[group_rows]
            scaled = group_logits / temperatures.unsqueeze(1)
            if want_filtered:
                top_ks = [p.top_k for p in group_params]
                top_ps = [p.top_p for p in group_params]
                probs, token_ids = top_k_top_p_candidates(scaled, top_ks, top_ps)
                # NOTE: log(0) = -inf: tokens outside top-k / top-p can never win.
                scores = probs.log_().add_(gumbel_noise(group_keys, token_ids))
                picked = token_ids.gather(1, scores.argmax(dim=-1, keepdim=True)).squeeze(1)
            else:
                vocab_ids = torch.arange(scaled.shape[1], device=logits.device)
                # NOTE: a few rows at a time, so the hash's temporaries stay in the CPU cache
                # (half the time of one pass over all rows' 49k tokens).
                for start in range(0, len(group), NOISE_ROWS_PER_CHUNK):
                    rows_slice = slice(start, start + NOISE_ROWS_PER_CHUNK)
                    scaled[rows_slice] += gumbel_noise(group_keys[rows_slice], vocab_ids)
                picked = scaled.argmax(dim=-1)
            tokens[group_rows] = picked
        return tokens.tolist()

    def _mask_by_grammar(
        self, logits: torch.Tensor, row_seqs: list[Sequence], rows: list[int]
    ) -> None:
        """Mask, in place, what each constrained row's grammar forbids next.

        NOTE: a constrained sequence never carries drafts (engine_core), so its one row is the
        position its grammar state is at.
        """
        num_words = (logits.shape[1] + 31) // 32
        bitmask = self._bitmask
        if bitmask is None or bitmask.shape[0] < len(row_seqs) or bitmask.shape[1] != num_words:
            bitmask = self._bitmask = torch.empty(len(row_seqs), num_words, dtype=torch.int32)
        for row in rows:
            grammar = row_seqs[row].grammar
            assert grammar is not None
            grammar.fill_bitmask(bitmask, row)
        apply_bitmask(logits, bitmask, rows)

    def _noise_keys(
        self, seeds: list[int | None], positions: list[int], device: torch.device
    ) -> torch.Tensor:
        """int32 [len(seeds)] noise keys: from (seed, position), or random for unseeded rows."""
        num_unseeded = sum(seed is None for seed in seeds)
        random_keys = iter(())
        if num_unseeded:
            random_keys = iter(
                torch.randint(
                    -(1 << 31), 1 << 31, (num_unseeded,), generator=self.generator
                ).tolist()
            )
        keys = [
            noise_key(seed, position) if seed is not None else next(random_keys)
            for seed, position in zip(seeds, positions, strict=True)
        ]
        return torch.tensor(keys, dtype=torch.int32, device=device)


def noise_key(seed: int, position: int) -> int:
    """The 32-bit (signed) noise key of output position `position` of a request seeded `seed`."""
    mixed = _splitmix64(_splitmix64(seed) ^ position) >> 32
    return mixed - (1 << 32) if mixed >= 1 << 31 else mixed


def gumbel_noise(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """float32 Gumbel(0, 1) noise [len(keys), num_tokens] for `token_ids` ([n] or [rows, n]).

    Counter-based: hash(key + token id) -> a 23-bit uniform in (0, 1) -> -log(-log(u)). Only the
    tokens asked for are computed, and each token's noise is the same whichever others are.
    """
    x = token_ids.to(torch.int32) + keys.to(torch.int32).unsqueeze(1)
    # NOTE: in place with one scratch tensor: for 32 x 49k tokens, fresh temporaries (page
    # faults) cost 3x the arithmetic. `>>` is arithmetic on int32; the masks make it logical.
    scratch = x >> 16
    x ^= scratch.bitwise_and_(0xFFFF)
    x *= _HASH_MUL_1
    x ^= torch.bitwise_right_shift(x, 15, out=scratch).bitwise_and_(0x1FFFF)
    x *= _HASH_MUL_2
    x ^= torch.bitwise_right_shift(x, 16, out=scratch).bitwise_and_(0xFFFF)
    x >>= 32 - _NOISE_BITS
    x &= (1 << _NOISE_BITS) - 1
    # (2k + 1) / 2^24: strictly inside (0, 1) and exact in float32, so the noise is finite.
    uniforms = x.float().mul_(2.0**-_NOISE_BITS).add_(2.0 ** -(_NOISE_BITS + 1))
    return uniforms.log_().neg_().log_().neg_()


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


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
    candidates: tuple[torch.Tensor, torch.Tensor] | None = None  # (probs, token ids)
    for size in CANDIDATE_SIZES:
        num_candidates = max(size, max_k)
        if num_candidates > CANDIDATE_SIZES[-1] or num_candidates >= vocab_size:
            break
        top_logits, top_ids = scaled_logits.topk(num_candidates, dim=-1)
        top_probs = torch.exp(top_logits - log_total)
        mass = top_probs.sum(dim=-1).tolist()
        # Complete when each row's top-k set, or its nucleus, lies inside the candidates.
        if all(k <= num_candidates or m >= p for k, p, m in zip(ks, top_ps, mass, strict=True)):
            candidates = top_probs, top_ids
            break
    if candidates is None:
        sorted_logits, token_ids = scaled_logits.sort(dim=-1, descending=True)
        probs = torch.exp(sorted_logits - log_total)
    else:
        probs, token_ids = candidates
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


def apply_penalties(
    logits: torch.Tensor, seqs: list[Sequence], draft_offsets: list[int] | None = None
) -> torch.Tensor:
    """OpenAI presence/frequency penalties over each row's generated tokens.

    Row i counts seqs[i]'s generated tokens plus its first draft_offsets[i] draft tokens (a
    speculative row is sampled as if those drafts had been accepted).
    """
    logits = logits.clone()
    vocab_size = logits.shape[1]
    for row, seq in enumerate(seqs):
        params: SamplingParams = seq.params
        offset = draft_offsets[row] if draft_offsets is not None else 0
        if not params.has_penalties or seq.num_completion_tokens + offset == 0:
            continue
        generated = seq.completion_token_ids + seq.draft_token_ids[:offset]
        ids = torch.tensor(generated, dtype=torch.long)
        counts = torch.bincount(ids, minlength=vocab_size)[:vocab_size].to(logits.dtype)
        logits[row] -= params.frequency_penalty * counts.to(logits.device)
        logits[row] -= params.presence_penalty * (counts > 0).to(logits.dtype).to(logits.device)
    return logits
