"""BlockManager: the paged KV cache's block pool, block tables and prefix cache.

Every block holds `block_size` token positions. A block that is full and computed is registered in
the prefix cache under a chained hash (parent block's hash + this block's token ids; the first
block's parent is derived from the request's cache salt, so tenants with different salts never
share blocks). On a hash hit the stored tokens, parent hash and salt are compared too, so a hash
collision cannot hand out the wrong keys/values.

The hashes are SHA-256, as vLLM's: the same prefix has the same hashes in every process and on
every replica (Python's `hash()` of a salt string changes with PYTHONHASHSEED), so what one
process says about its cached blocks means the same to another.

Freed blocks keep their contents and hash on an LRU free list; a later request with the same prefix
takes them back instead of recomputing. Only when a free block is reused for new tokens is its hash
dropped. Live sequences share cached blocks through reference counts.

With a disk tier (`disk_cache`, kv_disk_cache.py) a cached block is also written to disk the
first time a prompt reuses it, and a prompt's leading blocks that memory no longer holds (after a
restart, or evicted) are read back from disk into free blocks instead of being recomputed.
NOTE: written on reuse, not when first computed: what is reused (the fixed system prompts, a
conversation's history, shared passages) is what a restart should find warm, while most blocks
of one-off prompts would only churn the disk (a 1.5B model's block is ~0.45 MB).
"""

from __future__ import annotations

import array
import hashlib
import itertools
import logging
import sys
from collections import OrderedDict, deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from inference.engine.core.sequence import Sequence

logger = logging.getLogger(__name__)


# (parent hash, token ids): what a hash hit is checked against. The first block's parent is the
# root hash of its cache salt, so the key tells salts apart without holding one.
BlockKey = tuple[bytes, tuple[int, ...]]


class HasBlockKey(Protocol):
    @property
    def block_hash(self) -> bytes: ...

    @property
    def block_key(self) -> BlockKey: ...


StoredBlock = TypeVar("StoredBlock", bound=HasBlockKey)


class BlockStore(Protocol[StoredBlock]):
    """A tier below memory for cached blocks (kv_disk_cache.KVDiskCache)."""

    def read_run(self, blocks: list[tuple[bytes, BlockKey]]) -> list[StoredBlock]:
        """The leading blocks of (hash, key) `blocks` that the store holds, up to the first gap."""
        ...

    def restore(self, stored: StoredBlock, block_id: int) -> None:
        """Copy a block `read_run` returned into KV block `block_id`."""
        ...

    def save(self, block_hash: bytes, block_key: BlockKey, block_id: int) -> None:
        """Keep KV block `block_id`, cached as `block_hash`, in the store."""
        ...

    def newest(self, limit: int) -> list[bytes]:
        """The hashes of the `limit` most recently used blocks stored, the oldest first."""
        ...

    def read_any(self, block_hashes: list[bytes]) -> list[StoredBlock]:
        """The blocks of `block_hashes` the store holds (their keys as stored, checked)."""
        ...


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    block_key: BlockKey | None = None


# Token ids are hashed as 4-byte little-endian unsigned ints (every vocabulary fits; a negative or
# larger id raises OverflowError).
_TOKEN_TYPECODE = "I"
if array.array(_TOKEN_TYPECODE).itemsize != 4:  # pragma: no cover - no CPython platform we serve
    raise ImportError("the block hashes need a 4-byte unsigned array type")


def root_hash(cache_salt: str | None) -> bytes:
    """The parent hash of a sequence's first block: a digest of its cache salt (or of none)."""
    salt = b"\x00" if cache_salt is None else b"\x01" + cache_salt.encode()
    return hashlib.sha256(b"cachet-kv-blocks-v1\x00" + salt).digest()


def hash_blocks(parent_hash: bytes, token_ids: list[int], block_size: int) -> list[bytes]:
    """The chained hashes of the full blocks of `token_ids`, the first one chained to
    `parent_hash`: SHA-256 of (parent hash, the block's token ids as fixed-width ints).

    NOTE: the ids are packed once for all blocks (array, not a tuple per block), so hashing a
    2,000-token prompt costs tens of microseconds (`python -m bench.block_hashing`).
    """
    packed = array.array(_TOKEN_TYPECODE, token_ids)
    if sys.byteorder == "big":  # pragma: no cover - the same bytes on every host
        packed.byteswap()
    data = packed.tobytes()
    step = block_size * packed.itemsize
    hashes = []
    sha256 = hashlib.sha256
    for start in range(0, len(data) - step + 1, step):
        parent_hash = sha256(parent_hash + data[start : start + step]).digest()
        hashes.append(parent_hash)
    return hashes


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        disk_cache: BlockStore[Any] | None = None,
    ):
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
        self.hash_to_block: dict[bytes, Block] = {}
        self.disk_cache = disk_cache if enable_prefix_caching else None
        # Disk blocks still to load while the engine is idle (warm_up), the oldest first.
        self.warm_up_hashes: deque[bytes] = deque()
        if self.disk_cache is not None:
            self.warm_up_hashes.extend(self.disk_cache.newest(num_blocks))

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
        parent_hash = root_hash(seq.cache_salt)
        for index in range(num_full):
            block_hash = seq.block_hashes[index]
            block = self.hash_to_block.get(block_hash)
            if block is None and self.disk_cache is not None:
                self._load_from_disk(seq, index, num_full, computed)
                block = self.hash_to_block.get(block_hash)
            if block is None or block.block_key != self._block_key(seq, index, parent_hash):
                break
            if self.disk_cache is not None:
                self.disk_cache.save(block_hash, block.block_key, block.block_id)
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
                block.block_hash = block_hash
                block.block_key = self._block_key(seq, index, self._parent_hash(seq, index))
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

    def hold(self, blocks: Collection[Block]) -> None:
        """Keep `blocks` out of the free pool until `release` (their contents are read later)."""
        for block in blocks:
            if block.ref_count == 0:
                del self.free_blocks[block.block_id]
            block.ref_count += 1

    def release(self, blocks: Collection[Block]) -> None:
        """Undo `hold`: blocks nobody else uses go back to the free pool, most recently used."""
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks[block.block_id] = block
                if block.block_hash is None:
                    self.free_blocks.move_to_end(block.block_id, last=False)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their contents)."""
        for block in self.hash_to_block.values():
            block.block_hash = None
            block.block_key = None
        self.hash_to_block.clear()

    def _load_from_disk(self, seq: Sequence, start: int, stop: int, computed: list[Block]) -> None:
        """Read `seq`'s blocks start.. (up to `stop`, a block memory holds, or the free blocks
        that are not already `computed`) from the disk tier into free blocks, registered in the
        prefix cache and left free for the caller to take like any cached block.

        NOTE: the free blocks taken are the least recently freed ones, as allocation would take;
        blocks already matched for this prompt are skipped, they are about to be used.
        """
        assert self.disk_cache is not None
        taken = {block.block_id for block in computed}
        # NOTE: only as many free blocks as the prompt could use: the free list may hold
        # thousands, and this runs for every prompt whose blocks memory lacks.
        candidates = (block for block in self.free_blocks.values() if block.block_id not in taken)
        targets = list(itertools.islice(candidates, stop - start))
        wanted: list[tuple[bytes, BlockKey]] = []
        for index in range(start, min(stop, start + len(targets))):
            block_hash = seq.block_hashes[index]
            if block_hash in self.hash_to_block:
                break
            wanted.append((block_hash, self._block_key(seq, index, self._parent_hash(seq, index))))
        for stored, target in zip(self.disk_cache.read_run(wanted), targets, strict=False):
            self._adopt(stored, target)

    @property
    def is_warming_up(self) -> bool:
        return bool(self.warm_up_hashes)

    def warm_up(self, max_blocks: int) -> int:
        """Load up to `max_blocks` of the disk tier's most recently used blocks into free blocks
        that hold no cached prefix; how many were loaded.

        The engine calls it while idle after a start, so the first chats after a restart find
        their prefixes in memory. Loading stops for good when no such free block is left: a
        warmed-up block never pushes out one that served a request.
        """
        if self.disk_cache is None:
            self.warm_up_hashes.clear()
            return 0
        uncached = (block for block in self.free_blocks.values() if block.block_hash is None)
        empty = list(itertools.islice(uncached, max_blocks))
        if not empty:
            self.warm_up_hashes.clear()
            return 0
        wanted: list[bytes] = []
        num_taken = 0
        for block_hash in self.warm_up_hashes:
            if len(wanted) == len(empty):
                break
            num_taken += 1
            if block_hash not in self.hash_to_block:
                wanted.append(block_hash)
        stored_blocks = self.disk_cache.read_any(wanted) if wanted else []
        for stored, target in zip(stored_blocks, empty, strict=False):
            if stored.block_hash in self.hash_to_block:  # NOTE: two files, one block
                continue
            self._adopt(stored, target)
        # NOTE: taken off the queue only once adopted, so `is_warming_up` stays true until the
        # last batch is in memory (another thread may wait on it).
        for _ in range(num_taken):
            self.warm_up_hashes.popleft()
        return len(stored_blocks)

    def _adopt(self, stored: HasBlockKey, target: Block) -> None:
        """Copy a block read from the disk tier into free block `target` and cache it there, the
        most recently used of the free blocks."""
        assert self.disk_cache is not None
        self._uncache(target)
        self.disk_cache.restore(stored, target.block_id)
        target.block_hash = stored.block_hash
        target.block_key = stored.block_key
        self.hash_to_block[stored.block_hash] = target
        self.free_blocks.move_to_end(target.block_id)

    def _uncache(self, block: Block) -> None:
        if block.block_hash is not None:
            if self.hash_to_block.get(block.block_hash) is block:
                del self.hash_to_block[block.block_hash]
            block.block_hash = None
            block.block_key = None

    def _block_key(self, seq: Sequence, index: int, parent_hash: bytes) -> BlockKey:
        start = index * self.block_size
        return (parent_hash, tuple(seq.token_ids[start : start + self.block_size]))

    @staticmethod
    def _parent_hash(seq: Sequence, index: int) -> bytes:
        return seq.block_hashes[index - 1] if index else root_hash(seq.cache_salt)

    def _extend_block_hashes(self, seq: Sequence, num_full: int) -> None:
        hashes = seq.block_hashes
        num_hashed = len(hashes)
        if num_full <= num_hashed:
            return
        parent_hash = hashes[-1] if hashes else root_hash(seq.cache_salt)
        tokens = seq.token_ids[num_hashed * self.block_size : num_full * self.block_size]
        hashes.extend(hash_blocks(parent_hash, tokens, self.block_size))
