"""BlockManager: paged allocation, chained-hash prefix cache, LRU reuse, ref counts; the hashes
themselves (SHA-256, the same in every process)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from inference.engine.core.block_manager import BlockManager, hash_blocks, root_hash
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.sequence import Sequence

BLOCK_SIZE = 4


def make_seq(token_ids, cache_salt=None, request_id="r") -> Sequence:
    return Sequence(request_id, list(token_ids), SamplingParams(), cache_salt=cache_salt)


def run_prefill(manager: BlockManager, seq: Sequence) -> None:
    """Allocate like the scheduler does for a whole prompt and mark it computed."""
    computed = manager.get_computed_blocks(seq)
    num_cached = len(computed) * manager.block_size
    assert manager.allocate_slots(seq, seq.num_tokens - num_cached, computed) is not None
    seq.num_computed_tokens = seq.num_tokens
    seq.num_cached_tokens = num_cached
    manager.cache_full_blocks(seq)


def test_allocate_slots_gives_enough_blocks_and_returns_none_when_full():
    manager = BlockManager(4, BLOCK_SIZE)
    seq = make_seq(range(9))
    assert manager.allocate_slots(seq, 9) == [0, 1, 2]
    assert manager.usage == 0.75
    other = make_seq(range(100, 108), request_id="other")
    assert manager.allocate_slots(other, 8) is None
    assert other.block_table == []
    assert manager.num_free_blocks == 1


def test_allocate_slots_adds_a_block_only_when_the_last_one_is_full():
    manager = BlockManager(4, BLOCK_SIZE)
    seq = make_seq(range(3))
    manager.allocate_slots(seq, 3)
    seq.num_computed_tokens = 3
    assert manager.allocate_slots(seq, 1) == []
    seq.num_computed_tokens = 4
    assert manager.allocate_slots(seq, 1) == [1]


def test_prefix_hit_reuses_blocks_and_leaves_the_last_token_to_compute():
    manager = BlockManager(8, BLOCK_SIZE)
    first = make_seq(range(8))
    run_prefill(manager, first)
    manager.free(first)
    # Same 8 tokens: only the first block may be reused, so one token is left to compute.
    again = make_seq(range(8), request_id="again")
    computed = manager.get_computed_blocks(again)
    assert [b.block_id for b in computed] == [first_block_id(manager, range(4))]
    longer = make_seq([*range(8), 50], request_id="longer")
    assert len(manager.get_computed_blocks(longer)) == 2


def first_block_id(manager: BlockManager, tokens) -> int:
    probe = make_seq([*tokens, 999], request_id="probe")
    return manager.get_computed_blocks(probe)[0].block_id


def test_hash_chaining_means_a_block_only_hits_after_the_same_prefix():
    manager = BlockManager(8, BLOCK_SIZE)
    run_prefill(manager, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # Second block's tokens match but the first block differs: no hit at all.
    assert manager.get_computed_blocks(make_seq([0, 0, 0, 0, 5, 6, 7, 8, 9])) == []
    assert len(manager.get_computed_blocks(make_seq([1, 2, 3, 4, 5, 6, 7, 0, 9]))) == 1


def test_cache_salt_isolates_tenants():
    manager = BlockManager(8, BLOCK_SIZE)
    run_prefill(manager, make_seq(range(9), cache_salt="tenant-a"))
    assert manager.get_computed_blocks(make_seq(range(9), cache_salt="tenant-b")) == []
    assert manager.get_computed_blocks(make_seq(range(9))) == []
    assert len(manager.get_computed_blocks(make_seq(range(9), cache_salt="tenant-a"))) == 2


def test_a_hash_hit_with_different_tokens_is_a_miss():
    manager = BlockManager(8, BLOCK_SIZE)
    run_prefill(manager, make_seq(range(5)))
    block = next(iter(manager.hash_to_block.values()))
    block.block_key = (root_hash(None), (9, 9, 9, 9))  # as if another prefix collided on the hash
    assert manager.get_computed_blocks(make_seq(range(5))) == []


def test_live_sequences_share_blocks_through_ref_counts():
    manager = BlockManager(8, BLOCK_SIZE)
    first = make_seq(range(9), request_id="first")
    run_prefill(manager, first)
    second = make_seq([*range(8), 77], request_id="second")
    run_prefill(manager, second)
    assert second.num_cached_tokens == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert [manager.blocks[b].ref_count for b in first.block_table] == [2, 2, 1]
    manager.free(first)
    assert [manager.blocks[b].ref_count for b in second.block_table] == [1, 1, 1]
    assert manager.num_free_blocks == 8 - 3
    manager.free(second)
    assert manager.usage == 0.0


def test_freed_blocks_keep_their_hash_until_reused_in_lru_order():
    manager = BlockManager(4, BLOCK_SIZE)
    old = make_seq(range(5), request_id="old")
    run_prefill(manager, old)  # blocks 0 (cached) and 1 (partial)
    manager.free(old)
    new = make_seq(range(100, 105), request_id="new")
    run_prefill(manager, new)  # takes never-cached blocks first
    manager.free(new)
    # Both cached prefixes still hit.
    assert len(manager.get_computed_blocks(make_seq(range(5)))) == 1
    assert len(manager.get_computed_blocks(make_seq(range(100, 105)))) == 1
    # Needing every block evicts the least recently freed cached block ("old") first.
    big = make_seq(range(200, 212), request_id="big")
    assert manager.allocate_slots(big, 12) is not None
    assert manager.get_computed_blocks(make_seq(range(5))) == []
    assert len(manager.get_computed_blocks(make_seq(range(100, 105)))) == 1


def test_free_releases_the_tail_first_so_the_prefix_survives_longest():
    manager = BlockManager(3, BLOCK_SIZE)
    seq = make_seq(range(12))
    manager.allocate_slots(seq, 12)
    seq.num_computed_tokens = 12
    manager.cache_full_blocks(seq)
    manager.free(seq)
    # One new block evicts the tail block; the first two blocks still hit.
    assert manager.allocate_slots(make_seq([5], request_id="x"), 1) is not None
    assert len(manager.get_computed_blocks(make_seq([*range(12), 1]))) == 2


def test_taking_cached_free_blocks_counts_against_free_space():
    manager = BlockManager(3, BLOCK_SIZE)
    first = make_seq(range(9), request_id="a")
    run_prefill(manager, first)
    manager.free(first)
    seq = make_seq([*range(8), 1, 2, 3, 4, 5], request_id="b")
    computed = manager.get_computed_blocks(seq)
    assert len(computed) == 2
    # 2 cached free blocks + 2 new blocks > 3 free blocks: nothing changes.
    assert manager.allocate_slots(seq, 5, computed) is None
    assert all(block.ref_count == 0 for block in computed)
    assert seq.block_table == []
    assert manager.allocate_slots(seq, 4, computed) is not None
    assert manager.num_free_blocks == 0


def test_prefix_caching_can_be_turned_off():
    manager = BlockManager(8, BLOCK_SIZE, enable_prefix_caching=False)
    run_prefill(manager, make_seq(range(9)))
    assert manager.get_computed_blocks(make_seq(range(9))) == []
    assert manager.hash_to_block == {}


def test_reset_prefix_cache_forgets_every_prefix():
    manager = BlockManager(8, BLOCK_SIZE)
    run_prefill(manager, make_seq(range(9)))
    manager.reset_prefix_cache()
    assert manager.get_computed_blocks(make_seq(range(9))) == []


def test_a_pool_without_blocks_is_rejected():
    with pytest.raises(ValueError, match="at least one block"):
        BlockManager(0, BLOCK_SIZE)


def test_block_hashes_are_sha256_of_the_parent_hash_and_the_token_ids_as_little_endian_ints():
    parent = root_hash("tenant-a")
    first = hashlib.sha256(parent + b"".join(t.to_bytes(4, "little") for t in (1, 2, 3, 4)))
    second = hashlib.sha256(first.digest() + bytes.fromhex("05000000060000000700000008000000"))
    # The partial last block has no hash.
    assert hash_blocks(parent, [1, 2, 3, 4, 5, 6, 7, 8, 9], BLOCK_SIZE) == [
        first.digest(),
        second.digest(),
    ]
    assert root_hash(None) != root_hash("") != root_hash("tenant-a")


def test_a_sequence_extends_its_hashes_as_blocks_fill_without_rehashing_its_prefix():
    manager = BlockManager(8, BLOCK_SIZE)
    seq = make_seq(range(6), cache_salt="s")
    run_prefill(manager, seq)
    assert seq.block_hashes == hash_blocks(root_hash("s"), list(range(4)), BLOCK_SIZE)
    seq.token_ids += [6, 7, 8]
    seq.num_computed_tokens = 9
    manager.cache_full_blocks(seq)
    assert seq.block_hashes == hash_blocks(root_hash("s"), list(range(9)), BLOCK_SIZE)


HASHES_IN_A_CHILD = """
from inference.engine.core.block_manager import BlockManager
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.sequence import Sequence
seq = Sequence("r", list(range(40)), SamplingParams(), cache_salt="user:7")
BlockManager(16, 4).get_computed_blocks(seq)
print(",".join(h.hex() for h in seq.block_hashes))
"""


def test_the_same_prefix_has_the_same_block_hashes_in_processes_of_other_hash_seeds():
    def hashes_with_seed(seed: str) -> str:
        env = os.environ | {"PYTHONHASHSEED": seed}
        child = [sys.executable, "-c", HASHES_IN_A_CHILD]
        return subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout

    seq = make_seq(range(40), cache_salt="user:7")
    BlockManager(16, 4).get_computed_blocks(seq)
    here = ",".join(h.hex() for h in seq.block_hashes)
    assert hashes_with_seed("1").strip() == hashes_with_seed("2").strip() == here
