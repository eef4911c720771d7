"""Chunk-KV reuse: a retrieved passage's keys/values computed once, reused at any position.

A RAG prompt puts the retrieved passages in the newest user turn, so the prefix cache never
covers them: every new question prefills ~1,000 tokens of passages that earlier questions have
already run through the model. Here a passage's keys/values are computed once *on its own*,
right after the prompt's fixed system prefix (`prefix_len` tokens): the token sequence
`prompt[:prefix_len] + passage`. Those blocks live in the prefix cache like any others (and in
its disk tier, keyed by the model's fingerprint and the cache salt), found again by the block
hashes of that sequence.

When a later prompt holds the passage at another position, its keys/values are copied into the
prompt's blocks, the keys re-rotated by the position shift (RoPE rotations add up: rotating a
key stored at position p by d gives the key at p + d), and only the rest is computed: every
token that is not a reused passage token (the turn's own text, the question) plus the first
`recompute_tokens` of each passage. Those recomputed tokens attend over the whole prompt, so
they restore the attention across passages that the separately computed keys/values lack; the
passage's leading tokens are where the lack shows most (the attention sink that a lone passage
puts on its first tokens, see EPIC, "Efficient Position-Independent Context Caching", and
CacheBlend), and a passage's tail after its last full block is never cached, so it is
recomputed too. The step runs the recomputed tokens at their positions, each attending every
position before it (`BatchEntry.positions`).

Which passage tokens are recomputed: by default (`by_deviation`, EngineConfig.chunk_kv_selection
"deviation") not each passage's first ones but, over all passages, as many of those whose keys
and values the prompt's context changes most. Every reusable token is copied; when the step runs,
the engine core probes the prompt's first layers (ModelRunner.kv_deviation) and adds the most
changed positions to the step (`BlendPlan.num_selected`): CacheBlend's selection. Measured
against the leading choice in the README ("Chunk-KV reuse").

A passage whose keys/values are not cached yet is prefilled normally in that prompt, and
computed on its own afterwards (an internal request, `standalone_prompts`) so that the next
prompt holding it reuses it.

Approximate by design: the reused keys/values of a passage never saw the passages before it.
It is a setting (`EngineConfig.chunk_kv_reuse`), measured against full prefill in
`bench.chunk_reuse` (TTFT and answer F1).
"""

from __future__ import annotations

from inference.engine.core.block_manager import Block, BlockManager, hash_blocks, root_hash
from inference.engine.core.reusable_spans import BlendPlan, BlendRun
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.sequence import Sequence


def standalone_tokens(seq: Sequence, span: tuple[int, int], prefix_len: int) -> list[int]:
    """The token sequence a passage's reusable keys/values are computed as."""
    start, end = span
    return seq.token_ids[:prefix_len] + seq.token_ids[start:end]


def plan_blend(
    block_manager: BlockManager,
    seq: Sequence,
    num_cached: int,
    recompute_tokens: int,
    *,
    by_deviation: bool = False,
) -> BlendPlan | None:
    """The blend for `seq`'s first admission after `num_cached` prefix-cache tokens, or None
    when nothing can be reused (it is then prefilled as usual).

    Each reused passage has `recompute_tokens` of its tokens recomputed: its first ones, or,
    `by_deviation`, as many chosen over all passages when the step runs (`num_selected`).

    Holds the source blocks it found (the caller releases them with `release` after copying,
    or when it drops the plan).
    """
    reusable = seq.reusable
    if reusable is None:
        return None
    block_size = block_manager.block_size
    prefix_len = reusable.prefix_len
    runs: list[BlendRun] = []
    held: list[Block] = []
    missing: list[list[int]] = []
    reused_positions: set[int] = set()
    for span in reusable.spans:
        start, end = span
        if end <= num_cached:
            continue  # the prefix cache has it in place already
        tokens = standalone_tokens(seq, span, prefix_len)
        probe = Sequence(f"{seq.request_id}/probe", tokens, _PROBE_PARAMS, seq.cache_salt)
        blocks = block_manager.get_computed_blocks(probe)
        num_source_tokens = len(blocks) * block_size
        # NOTE: computed alone, only its full blocks are cached (never the last token): one
        # whose cached part would not reach past its recomputed head is never worth it.
        num_cacheable = (len(tokens) - 1) // block_size * block_size
        if num_source_tokens <= prefix_len:
            if num_cacheable - prefix_len > recompute_tokens:
                missing.append(tokens)
            continue
        if num_source_tokens < num_cacheable:
            missing.append(tokens)  # its tail was evicted: computed again, reused whole next
        block_manager.hold(blocks)
        held.extend(blocks)
        first = max(start + (0 if by_deviation else recompute_tokens), num_cached)
        last = min(end, start + num_source_tokens - prefix_len)
        if first >= last:
            continue
        shift = start - prefix_len
        source_slots = []
        for position in range(first, last):
            source_position = position - shift
            block = blocks[source_position // block_size]
            source_slots.append(block.block_id * block_size + source_position % block_size)
        runs.append(BlendRun(source_slots, list(range(first, last)), shift))
        reused_positions.update(range(first, last))
    if not runs:
        block_manager.release(held)
        return None if not missing else BlendPlan([], [], [], missing)
    query_positions = [p for p in range(num_cached, seq.num_tokens) if p not in reused_positions]
    num_selected = min(recompute_tokens * len(runs), len(reused_positions)) if by_deviation else 0
    return BlendPlan(
        runs, [block.block_id for block in held], query_positions, missing, num_selected
    )


def release(block_manager: BlockManager, plan: BlendPlan) -> None:
    """Let go of the plan's source blocks (they stay cached)."""
    block_manager.release([block_manager.blocks[i] for i in plan.source_block_ids])
    plan.source_block_ids = []


def passage_key(tokens: list[int], cache_salt: str | None) -> str:
    """A short name for a standalone passage sequence (the internal request computing it)."""
    return hash_blocks(root_hash(cache_salt), tokens, max(1, len(tokens)))[0].hex()[:32]


# A probe never runs: it only names a passage's blocks for `get_computed_blocks`.
_PROBE_PARAMS = SamplingParams(temperature=0, max_tokens=1)
# A passage computed on its own: its prompt's keys/values are the point, one token is sampled.
PASSAGE_PARAMS = SamplingParams(temperature=0, max_tokens=1)
