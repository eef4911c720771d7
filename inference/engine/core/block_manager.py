"""BlockManager: the paged KV cache's block pool, block tables and prefix cache.

Every block holds `block_size` token positions. A block that is full and computed is registered in
the prefix cache under a chained hash (parent block's hash + this block's token ids; the first
block's parent is derived from the request's cache salt, so tenants with different salts never
share blocks). On a hash hit the stored tokens, parent hash and salt are compared too, so a hash
collision cannot hand out the wrong keys/values.

Freed blocks keep their contents and hash on an LRU free list; a later request with the same prefix
takes them back instead of recomputing. Only when a free block is reused for new tokens is its hash
dropped. Live sequences share cached blocks through reference counts.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

from inference.engine.core.sequence import Sequence

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    # (parent hash, salt, token ids): what a hash hit is checked against.
    block_key: tuple[int | None, str | None, tuple[int, ...]] | None = None


def hash_block(parent_hash: int | None, cache_salt: str | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, cache_salt, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(block_id) for block_id in range(num_blocks)]
        # NOTE: front = evicted first. Blocks holding no cached prefix go to the front so cached
        # prefixes survive as long as possible.
        self.free_blocks: OrderedDict[int, Block] = OrderedDict(
            (b.block_id, b) for b in self.blocks
        )
        self.hash_to_block: dict[int, Block] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences (cached but free blocks count as free)."""
        return 1.0 - len(self.free_blocks) / self.num_blocks

    def get_computed_blocks(self, seq: Sequence) -> list[Block]:
        """Blocks of the prefix cache that hold `seq`'s leading full blocks, longest match first.

        NOTE: the last token is never taken from the cache, so at least one token is computed and
        the step yields logits for it.
        """
        if not self.enable_prefix_caching:
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        self._extend_block_hashes(seq, num_full)
        computed: list[Block] = []
        parent_hash = None
        for index in range(num_full):
            block_hash = seq.block_hashes[index]
            block = self.hash_to_block.get(block_hash)
            if block is None or block.block_key != self._block_key(seq, index, parent_hash):
                break
            computed.append(block)
            parent_hash = block_hash
        return computed

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: Collection[Block] = ()
    ) -> list[int] | None:
        """Give `seq` blocks for `computed_blocks` plus `num_new_tokens` more tokens.

        Returns the newly allocated block ids, or None (changing nothing) when there are not
        enough free blocks; the scheduler then preempts or waits.
        """
        num_computed = seq.num_computed_tokens + len(computed_blocks) * self.block_size
        num_required = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = max(0, num_required - len(seq.block_table) - len(computed_blocks))
        # Cached blocks that are currently free leave the free pool when this sequence takes them.
        num_taken_free = sum(1 for block in computed_blocks if block.ref_count == 0)
        if num_new_blocks + num_taken_free > len(self.free_blocks):
            return None
        for block in computed_blocks:
            if block.ref_count == 0:
                del self.free_blocks[block.block_id]
            block.ref_count += 1
            seq.block_table.append(block.block_id)
        if computed_blocks:
            seq.num_hashed_blocks = len(seq.block_table)
        new_block_ids = []
        for _ in range(num_new_blocks):
            _, block = self.free_blocks.popitem(last=False)
            self._uncache(block)
            block.ref_count = 1
            new_block_ids.append(block.block_id)
        seq.block_table.extend(new_block_ids)
        return new_block_ids

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register `seq`'s newly computed full blocks in the prefix cache.

        Called after the model has run, so the cache never points at blocks whose keys/values
        were not written (for instance when a step fails).
        """
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_hashed_blocks:
            return
        self._extend_block_hashes(seq, num_full)
        for index in range(seq.num_hashed_blocks, num_full):
            block = self.blocks[seq.block_table[index]]
            block_hash = seq.block_hashes[index]
            # NOTE: if another sequence computed the same block in the same step, the first one
            # stays registered and this copy stays private (freed without a hash).
            if block.block_hash is None and block_hash not in self.hash_to_block:
                parent_hash = seq.block_hashes[index - 1] if index else None
                block.block_hash = block_hash
                block.block_key = self._block_key(seq, index, parent_hash)
                self.hash_to_block[block_hash] = block
        seq.num_hashed_blocks = num_full

    def free(self, seq: Sequence) -> None:
        """Release `seq`'s blocks, tail first, so its prefix is the last part to be evicted."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks[block_id] = block
                if block.block_hash is None:
                    self.free_blocks.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their contents)."""
        for block in self.hash_to_block.values():
            block.block_hash = None
            block.block_key = None
        self.hash_to_block.clear()

    def _uncache(self, block: Block) -> None:
        if block.block_hash is not None:
            if self.hash_to_block.get(block.block_hash) is block:
                del self.hash_to_block[block.block_hash]
            block.block_hash = None
            block.block_key = None

    def _block_key(
        self, seq: Sequence, index: int, parent_hash: int | None
    ) -> tuple[int | None, str | None, tuple[int, ...]]:
        start = index * self.block_size
        return (parent_hash, seq.cache_salt, tuple(seq.token_ids[start : start + self.block_size]))

    def _extend_block_hashes(self, seq: Sequence, num_full: int) -> None:
        hashes = seq.block_hashes
        size = self.block_size
        for index in range(len(hashes), num_full):
            parent_hash = hashes[index - 1] if index else None
            tokens = tuple(seq.token_ids[index * size : (index + 1) * size])
            hashes.append(hash_block(parent_hash, seq.cache_salt, tokens))
