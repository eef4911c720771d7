"""The prefix cache's disk tier: warm after a restart, never wrong, never in the way.

Blocks are written when a prompt reuses them, so each test serves its prompt twice before the
restart (`serve_twice`).

A "restart" here is a new engine (a new block manager: nothing cached in memory) on the same real
SmolLM2 runner whose KV tensors are zeroed first, so whatever the second engine reuses can only
have come from disk.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from inference.engine.core.block_manager import hash_blocks, root_hash
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.kv_disk_cache import FORMAT_VERSION, KVDiskCache, kv_fingerprint
from tests.engine.real_model import RealEngines, chat, float32_runner

pytestmark = pytest.mark.real_weights

MAX_MODEL_LEN = 256
BLOCK_SIZE = 16
GREEDY = SamplingParams(temperature=0, max_tokens=8)
QUESTION = (
    "Write two sentences about lighthouses and the ships they guide at night."
    + " Mention the rocks, the fog and the keepers." * 4
)


@pytest.fixture(scope="module")
def runner(chat_model_dir):
    return float32_runner(chat_model_dir, kv_cache_mb=24, max_model_len=MAX_MODEL_LEN)


@pytest.fixture
def engines(runner, real_tokenizer, chat_model_dir):
    engines = RealEngines(runner, real_tokenizer, chat_model_dir, MAX_MODEL_LEN)
    yield engines
    engines.shutdown()


@pytest.fixture
def prompt(real_tokenizer) -> list[int]:
    return chat(real_tokenizer, QUESTION)


def restart(engines: RealEngines, disk: Path, **config):
    """Stop every engine (writing what they queued), forget the KV contents, start a new one."""
    engines.shutdown()
    for tensor in engines.runner.kv_cache.storage:
        tensor.zero_()
    return engines.make(kv_disk_cache_dir=disk, **config)


def serve_twice(engine, prompt: list[int], **options):
    """The prompt served cold, then warm (which writes its cached blocks to disk); the cold one."""
    cold = engine.generate([prompt], GREEDY, **options)[0]
    engine.generate([prompt], GREEDY, **options)
    return cold


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def block_files(disk: Path) -> list[Path]:
    return sorted(disk.glob(f"v{FORMAT_VERSION}-*/*/*.kv"))


def num_full_blocks(prompt: list[int]) -> int:
    return (len(prompt) - 1) // BLOCK_SIZE  # the last token is always computed


def test_after_a_restart_the_first_request_reads_its_prefix_from_disk_and_answers_the_same(
    engines, prompt, tmp_path
) -> None:
    engine = engines.make(kv_disk_cache_dir=tmp_path)
    cold = engine.generate([prompt], GREEDY)[0]
    engine.core.disk_cache.flush()
    assert cold.usage.cached_tokens == 0
    assert block_files(tmp_path) == []  # computed once: not worth a write yet
    engine.generate([prompt], GREEDY)  # reused: written
    engine.core.disk_cache.flush()
    assert len(block_files(tmp_path)) == num_full_blocks(prompt)

    engine = restart(engines, tmp_path)
    warm = engine.generate([prompt], GREEDY)[0]

    assert warm.usage.cached_tokens == num_full_blocks(prompt) * BLOCK_SIZE > 0
    assert warm.token_ids == cold.token_ids
    assert engine.core.disk_cache.num_loaded == num_full_blocks(prompt)
    assert engine.metrics.snapshot()["kv_disk_blocks_loaded"] == num_full_blocks(prompt)
    exported = engine.metrics.registry.get_sample_value("cachet_engine_kv_disk_blocks_loaded")
    assert exported == num_full_blocks(prompt)


def test_another_cache_salt_never_reads_the_blocks_on_disk(engines, prompt, tmp_path) -> None:
    serve_twice(engines.make(kv_disk_cache_dir=tmp_path), prompt, cache_salt="team-a")

    engine = restart(engines, tmp_path)
    assert engine.generate([prompt], GREEDY, cache_salt="team-b")[0].usage.cached_tokens == 0
    assert engine.generate([prompt], GREEDY)[0].usage.cached_tokens == 0
    assert engine.generate([prompt], GREEDY, cache_salt="team-a")[0].usage.cached_tokens > 0


def test_after_a_restart_the_idle_engine_loads_the_newest_blocks_before_any_request(
    engines, prompt, tmp_path
) -> None:
    cold = serve_twice(engines.make(kv_disk_cache_dir=tmp_path), prompt)

    engine = restart(engines, tmp_path)
    wait_until(lambda: not engine.core.is_warming_up)
    hashes = hash_blocks(root_hash(None), prompt, BLOCK_SIZE)[: num_full_blocks(prompt)]
    assert all(h in engine.core.block_manager.hash_to_block for h in hashes)
    assert engine.core.disk_cache.num_loaded == len(hashes)

    warm = engine.generate([prompt], GREEDY)[0]
    assert warm.usage.cached_tokens == len(hashes) * BLOCK_SIZE
    assert warm.token_ids == cold.token_ids
    assert engine.core.disk_cache.num_loaded == len(hashes)  # nothing read on demand


def test_an_engine_loaded_from_a_gguf_file_keeps_its_prefix_cache_on_disk(
    runner, real_tokenizer, chat_model_dir, prompt, tmp_path
) -> None:
    # A GGUF file is a model_dir the engine loads (loader.py), not only a directory holding one.
    gguf = (chat_model_dir / "model.gguf").resolve()
    engines = RealEngines(runner, real_tokenizer, gguf, MAX_MODEL_LEN)
    try:
        cold = serve_twice(engines.make(kv_disk_cache_dir=tmp_path), prompt)
        engine = restart(engines, tmp_path)
        warm = engine.generate([prompt], GREEDY)[0]
    finally:
        engines.shutdown()
    assert len(block_files(tmp_path)) == num_full_blocks(prompt)
    assert warm.usage.cached_tokens == num_full_blocks(prompt) * BLOCK_SIZE
    assert warm.token_ids == cold.token_ids


def test_another_model_dtype_or_format_has_its_own_directory(
    engines, prompt, tmp_path, chat_model_dir, tiny_model_dir
) -> None:
    serve_twice(engines.make(kv_disk_cache_dir=tmp_path), prompt)
    engines.shutdown()

    settings = {
        "dtype": torch.float32,
        "quantization": "none",
        "quantization_group_size": 32,
        "kv_cache_dtype": "auto",
        "block_size": BLOCK_SIZE,
        "device": torch.device("cpu"),
    }
    served = kv_fingerprint(chat_model_dir, **settings)
    others = [
        kv_fingerprint(tiny_model_dir("llama"), **settings),
        kv_fingerprint(chat_model_dir, **(settings | {"dtype": torch.bfloat16})),
        kv_fingerprint(chat_model_dir, **(settings | {"quantization": "int8"})),
        kv_fingerprint(chat_model_dir, **(settings | {"kv_cache_dtype": "int8"})),
        kv_fingerprint(chat_model_dir, **(settings | {"block_size": 32})),
    ]
    assert served not in others and len(set(others)) == len(others)
    # Only the served model's directory holds blocks; a file dropped into it from another
    # model's directory is refused by its header.
    (directory,) = {path.parent.parent for path in block_files(tmp_path)}
    assert directory.name == f"v{FORMAT_VERSION}-{served[:32]}"


def test_truncated_corrupt_or_foreign_files_are_recomputed_and_deleted(
    engines, prompt, tmp_path, caplog
) -> None:
    cold = serve_twice(engines.make(kv_disk_cache_dir=tmp_path), prompt)
    engines.shutdown()
    hashes = hash_blocks(root_hash(None), prompt, BLOCK_SIZE)
    directory = block_files(tmp_path)[0].parent.parent
    paths = [directory / h.hex()[:2] / f"{h.hex()}.kv" for h in hashes]
    assert all(path.is_file() for path in paths[:3])
    # Block 0 truncated, block 1 with a flipped payload byte, block 2 holding block 0's file.
    paths[0].write_bytes(paths[0].read_bytes()[:-100])
    data = bytearray(paths[1].read_bytes())
    data[-1] ^= 0xFF
    paths[1].write_bytes(data)

    caplog.set_level(logging.WARNING, logger="inference.engine.kv_disk_cache")
    engine = restart(engines, tmp_path)
    first = engine.generate([prompt], GREEDY)[0]
    assert first.usage.cached_tokens == 0  # block 0 is unusable, so nothing after it is used
    assert first.token_ids == cold.token_ids
    assert "truncated" in caplog.text and "checksum" in caplog.text
    assert engine.core.disk_cache.num_rejected == 2

    engine.generate([prompt], GREEDY)  # reused: both rewritten
    engine = restart(engines, tmp_path)
    second = engine.generate([prompt], GREEDY)[0]
    assert second.usage.cached_tokens == num_full_blocks(prompt) * BLOCK_SIZE
    assert second.token_ids == cold.token_ids
    assert engine.core.disk_cache.num_rejected == 0

    shutil.copyfile(paths[0], paths[2])
    engine = restart(engines, tmp_path)
    third = engine.generate([prompt], GREEDY)[0]
    assert third.usage.cached_tokens == 2 * BLOCK_SIZE
    assert third.token_ids == cold.token_ids
    assert "other tokens" in caplog.text


def test_a_failing_disk_turns_writing_off_with_a_warning_and_serving_goes_on(
    engines, prompt, tmp_path, caplog
) -> None:
    engine = engines.make(kv_disk_cache_dir=tmp_path)
    disk_cache = engine.core.disk_cache
    # The cache's directory becomes a file: every write fails as on a full or broken disk.
    shutil.rmtree(disk_cache.directory)
    disk_cache.directory.write_text("not a directory")
    caplog.set_level(logging.WARNING, logger="inference.engine.kv_disk_cache")

    first = serve_twice(engine, prompt)
    disk_cache.flush()
    assert not disk_cache.writes_enabled
    assert caplog.text.count("stops writing") == 1
    again = engine.generate([prompt], GREEDY)[0]
    assert again.token_ids == first.token_ids
    assert again.usage.cached_tokens > 0  # the memory tier is untouched


def test_a_cache_directory_removed_while_serving_is_made_again_and_writing_goes_on(
    engines, prompt, real_tokenizer, tmp_path
) -> None:
    engine = engines.make(kv_disk_cache_dir=tmp_path)
    disk_cache = engine.core.disk_cache
    serve_twice(engine, prompt)
    disk_cache.flush()
    shutil.rmtree(tmp_path)  # an operator clearing the cache to free space

    other = chat(real_tokenizer, "Describe a harbour at dawn. " + "Gulls, nets and boats. " * 12)
    serve_twice(engine, other)
    disk_cache.flush()
    assert disk_cache.writes_enabled
    assert block_files(tmp_path)


def test_the_directory_stays_within_its_budget_least_recently_used_first(
    engines, prompt, tmp_path, runner
) -> None:
    assert num_full_blocks(prompt) >= 4
    block_bytes = sum(t[:, :, 0].numel() * t.element_size() for t in runner.kv_cache.storage)
    budget_mb = 3.5 * block_bytes / 2**20  # three blocks and their headers
    engine = engines.make(kv_disk_cache_dir=tmp_path, kv_disk_cache_mb=budget_mb)
    serve_twice(engine, prompt)
    engine.core.disk_cache.flush()

    files = block_files(tmp_path)
    assert len(files) == 3
    assert sum(path.stat().st_size for path in files) <= budget_mb * 2**20
    # The oldest (the prompt's first blocks) went first: the newest blocks are kept.
    hashes = hash_blocks(root_hash(None), prompt, BLOCK_SIZE)
    assert hashes[0].hex() not in {path.stem for path in files}


def test_a_block_file_is_only_read_for_the_exact_tokens_and_salt_it_was_written_for(
    runner, prompt, tmp_path
) -> None:
    fingerprint = "f" * 64
    block_hash = hash_blocks(root_hash(None), prompt, BLOCK_SIZE)[0]
    key = (root_hash(None), tuple(prompt[:BLOCK_SIZE]))
    runner.kv_cache.storage[0][:, :, 0].normal_()
    written = runner.kv_cache.storage[0][:, :, 0].clone()

    def write_block() -> None:
        writer = KVDiskCache(tmp_path, fingerprint, runner.kv_cache, max_bytes=1 << 30)
        writer.save(block_hash, key, 0)
        writer.close()

    write_block()
    reader = KVDiskCache(tmp_path, fingerprint, runner.kv_cache, max_bytes=1 << 30)
    assert reader.read(block_hash, (root_hash("a salt"), key[1])) is None  # and deleted
    write_block()
    assert reader.read(block_hash, (key[0], (key[1][0] + 1, *key[1][1:]))) is None
    # Written for other tokens under this name: refused by hash, even when asked by name alone.
    forged = KVDiskCache(tmp_path, fingerprint, runner.kv_cache, max_bytes=1 << 30)
    forged.save(block_hash, (key[0], (key[1][0] + 1, *key[1][1:])), 0)
    forged.close()
    assert reader.read_any([block_hash]) == []
    # Token ids no vocabulary has (the hashes pack 4-byte ids): refused too, not raised.
    huge = KVDiskCache(tmp_path, fingerprint, runner.kv_cache, max_bytes=1 << 30)
    huge.save(block_hash, (key[0], (1 << 40, *key[1][1:])), 0)
    huge.close()
    assert reader.read_any([block_hash]) == []
    write_block()
    (stored,) = reader.read_any([block_hash])
    assert stored.block_key == key
    reader.restore(stored, 5)
    assert torch.equal(runner.kv_cache.storage[0][:, :, 5], written)
    reader.close()


def test_block_files_are_the_owners_alone_and_a_crashed_writers_leftovers_are_cleared(
    runner, prompt, tmp_path
) -> None:
    fingerprint = "e" * 64
    block_hash = hash_blocks(root_hash(None), prompt, BLOCK_SIZE)[0]
    writer = KVDiskCache(tmp_path, fingerprint, runner.kv_cache, max_bytes=1 << 30)
    writer.save(block_hash, (root_hash(None), tuple(prompt[:BLOCK_SIZE])), 0)
    writer.close()
    (path,) = block_files(tmp_path)
    assert path.stat().st_mode & 0o077 == 0
    assert writer.directory.stat().st_mode & 0o077 == 0
    old = path.parent / ".left-by-a-crash.kv.1.2.tmp"
    new = path.parent / ".being-written.kv.3.4.tmp"
    old.write_bytes(b"half a block")
    new.write_bytes(b"half a block")
    os.utime(old, (time.time() - 7200, time.time() - 7200))

    KVDiskCache(tmp_path, fingerprint, runner.kv_cache, max_bytes=1 << 30).close()
    assert not old.exists() and new.exists()
