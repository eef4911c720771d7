"""KVDiskCache: the prefix cache's blocks kept on disk, so the first chat after a restart is warm.

Every block the prefix cache hands out again (core/block_manager.py says why on reuse) is also
written here, one file per block hash; when a prompt's leading blocks are not in memory (a
restart, or evicted), the block manager reads them back from here instead of recomputing them.

Layout: `<root>/v<FORMAT_VERSION>-<fingerprint>/<hash[:2]>/<hash>.kv`. The fingerprint
(`kv_fingerprint`: the model's files, dtype, weight and KV formats, block size, device type)
names the directory, so another model, quantization or KV format never looks at these files.
The block hash chains the request's cache salt (block_manager.root_hash), so another salt never
asks for them; and each file repeats what its block was computed from (its parent's hash, the
root hash of the salt for a first block, and its token ids), which must hash to the file's name
and equal what is asked for, as the in-memory cache compares its block keys, so neither a hash
collision nor a renamed file can hand out the wrong keys/values.

A file is MAGIC, the header's length (u32), the header (JSON: format version, fingerprint,
block key, each tensor's dtype and shape, the payload's length and CRC-32), then the payload:
the block's keys and values of every layer (and their scales, for an int8 cache). A file that is
truncated, fails its checksum, or was written by another version, model or layout is ignored and
deleted, and its block recomputed: never used. (CRC-32, not a cryptographic hash: it guards
against torn and rotten files at 0.11 ms per 0.45 MB block against SHA-256's 0.26; whoever can
write this directory can change the model's answers anyway.)

Reads are what a restarted server's first request waits for, so a prompt's run of missing blocks
is read and checked by `READ_THREADS` threads at once (file reads and CRC-32 release the GIL);
only the copies into the KV cache run on the engine thread, since torch work on other threads
would give libgomp more thread teams than cores (engine.py says what that costs).

Writes never hold up the engine: the engine thread copies the block (one indexing of the
cache's backing tensors) and queues it; a writer thread writes a temporary file and renames it
into place, so readers (other processes sharing the directory too) never see half a file. When
the queue is full the block is not written (the disk is slower than the engine; it is counted).
A write that fails (a full disk, a read-only directory) turns writing off with one warning;
reading goes on.

The directory is kept under `max_bytes`, least recently used first: a read touches its file's
modification time, so the order survives restarts. Each process counts the files it knows of
(those present at start and its own writes); processes sharing a directory may therefore
together exceed the budget by what the others wrote since.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from inference.engine.core.block_manager import BlockKey, hash_blocks
from inference.engine.kv_cache import KVCache

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAGIC = b"CACHETKV"
_HEADER_LENGTH = struct.Struct("<I")
SUFFIX = ".kv"
# Blocks waiting for the writer thread: at most this many copies are held in memory (a 1.5B
# model's block is ~0.45 MB, so ~60 MB at worst).
MAX_PENDING_WRITES = 128
# Read buffers kept for reuse, at most this many bytes (~70 blocks of a 1.5B model): a fresh
# 0.45 MB buffer costs more in page faults (0.29 ms measured) than reading the file into it.
MAX_POOLED_BYTES = 32 << 20
# A temporary file older than this at start was left by a writer that died.
STALE_TEMPORARY_S = 3600
# Threads reading a run of blocks (2: the cores this product is sized for; more only queue).
READ_THREADS = 2
# The model files' bytes read for the fingerprint: their first and last MiB, with their sizes.
_FINGERPRINT_SAMPLE_BYTES = 1 << 20


@dataclass(slots=True)
class StoredBlock:
    """A block read from disk and checked, ready to be copied into the KV cache."""

    block_hash: bytes
    block_key: BlockKey
    payload: memoryview
    path: Path
    buffer: bytearray  # what `payload` views, back to the pool once copied


@dataclass(slots=True)
class _PendingWrite:
    block_hash: bytes
    header: dict[str, Any]
    tensors: list[torch.Tensor]


def kv_fingerprint(
    model_dir: Path,
    *,
    dtype: torch.dtype,
    quantization: str,
    quantization_group_size: int,
    kv_cache_dtype: str,
    block_size: int,
    device: torch.device,
    chunk_kv_reuse: bool = False,
) -> str:
    """What a block's keys/values depend on besides its tokens, as a hex digest.

    `chunk_kv_reuse`: the engine blends prompts (core/chunk_reuse.py), so its cached blocks may
    hold copied, approximate keys/values; an engine that does not blend must never read them.

    NOTE: the model's files are identified by their names, sizes and first and last MiB (a
    GGUF's header and metadata, a safetensors file's tensor index and last tensor), not by
    hashing gigabytes at every start; the file's path is left out, so a moved or re-installed
    model keeps its cache.
    """
    digest = hashlib.sha256()
    settings = {
        "format": FORMAT_VERSION,
        "dtype": str(dtype),
        "quantization": quantization,
        "quantization_group_size": quantization_group_size,
        "kv_cache_dtype": kv_cache_dtype,
        "block_size": block_size,
        "device": device.type,
    }
    if chunk_kv_reuse:  # NOTE: only then, so that the exact engines' caches keep their digest
        settings["chunk_kv_reuse"] = True
    digest.update(json.dumps(settings, sort_keys=True).encode())
    # NOTE: `model_dir` may also be the GGUF file itself (loader.py loads either).
    model_path = Path(model_dir)
    paths = [model_path] if model_path.is_file() else sorted(model_path.iterdir())
    for path in paths:
        if not path.is_file():
            continue
        size = path.stat().st_size
        digest.update(f"\0{path.name}\0{size}\0".encode())
        with path.open("rb") as file:
            digest.update(file.read(_FINGERPRINT_SAMPLE_BYTES))
            if size > _FINGERPRINT_SAMPLE_BYTES:
                file.seek(max(_FINGERPRINT_SAMPLE_BYTES, size - _FINGERPRINT_SAMPLE_BYTES))
                digest.update(file.read())
    return digest.hexdigest()


def _key_fields(block_key: BlockKey) -> dict[str, Any]:
    parent_hash, token_ids = block_key
    return {"parent_hash": parent_hash.hex(), "token_ids": list(token_ids)}


def _key_from_header(header: dict[str, Any]) -> BlockKey | None:
    """The block key a file's header names, or None if it names none."""
    parent_hash, token_ids = header.get("parent_hash"), header.get("token_ids")
    if not isinstance(parent_hash, str) or not isinstance(token_ids, list):
        return None
    if not all(type(token_id) is int and 0 <= token_id < 1 << 32 for token_id in token_ids):
        return None
    try:
        return bytes.fromhex(parent_hash), tuple(token_ids)
    except ValueError:
        return None


class KVDiskCache:
    """Blocks of `kv_cache` written to and read back from files under `root`."""

    def __init__(self, root: Path, fingerprint: str, kv_cache: KVCache, *, max_bytes: int) -> None:
        if not kv_cache.storage:
            raise ValueError("the KV cache has no backing tensors to copy blocks from")
        if max_bytes < 1:
            raise ValueError(f"the disk cache needs a budget of at least one byte, got {max_bytes}")
        self.kv_cache = kv_cache
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes
        self.directory = Path(root) / f"v{FORMAT_VERSION}-{fingerprint[:32]}"
        # NOTE: owner-only: the files hold prompts' token ids (the text of users' chats).
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        # What every block's tensors look like: a file of another layout is never copied in.
        self.layout = [
            {"dtype": str(tensor.dtype), "shape": list(tensor[:, :, 0].shape)}
            for tensor in kv_cache.storage
        ]
        self.block_bytes = sum(
            tensor[:, :, 0].numel() * tensor.element_size() for tensor in kv_cache.storage
        )
        self.num_loaded = 0
        self.num_written = 0
        self.num_dropped = 0
        self.num_rejected = 0
        self.writes_enabled = True
        # hash -> file size, least recently used first; shared by the engine and writer threads.
        self._lock = threading.Lock()
        self._files: OrderedDict[bytes, int] = self._scan()
        self._num_bytes = sum(self._files.values())
        self._queued: set[bytes] = set()  # handed to the writer, not written yet
        self._buffers: list[bytearray] = []  # read buffers for reuse (MAX_POOLED_BYTES)
        self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="kv-disk-reader")
        self._pending: queue.Queue[_PendingWrite | None] = queue.Queue(MAX_PENDING_WRITES)
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._writer.start()
        logger.info(
            "KV disk cache: %s, %d blocks (%.1f MiB) of a %.0f MiB budget",
            self.directory,
            len(self._files),
            self._num_bytes / 2**20,
            max_bytes / 2**20,
        )

    @property
    def num_bytes(self) -> int:
        return self._num_bytes

    def read_run(self, blocks: list[tuple[bytes, BlockKey]]) -> list[StoredBlock]:
        """The leading blocks of `blocks` (hash, key) that files hold, read in parallel: up to
        the first one missing or unusable."""
        # NOTE: a prompt new to the cache misses at once: one stat, not a pool of failed opens.
        num_present = 0
        while num_present < len(blocks) and self._path(blocks[num_present][0]).exists():
            num_present += 1
        blocks = blocks[:num_present]
        if len(blocks) <= 1:
            stored = [self.read(*block) for block in blocks]
        else:
            stored = list(self._readers.map(lambda block: self.read(*block), blocks))
        run: list[StoredBlock] = []
        after_gap = False
        for block in stored:
            if block is None:
                after_gap = True
            elif after_gap:  # never restored
                self._give_back(block.buffer)
            else:
                run.append(block)
        return run

    def read_any(self, block_hashes: list[bytes]) -> list[StoredBlock]:
        """The blocks of `block_hashes` that files hold, whatever their tokens, read in parallel
        (warming up: the files say what they hold, and it is checked against their hashes)."""
        stored = self._readers.map(lambda block_hash: self.read(block_hash, None), block_hashes)
        return [block for block in stored if block is not None]

    def newest(self, limit: int) -> list[bytes]:
        """The hashes of the `limit` most recently used blocks on disk, the oldest first."""
        with self._lock:
            hashes = list(self._files)
        return hashes[-limit:] if limit > 0 else []

    def read(self, block_hash: bytes, block_key: BlockKey | None) -> StoredBlock | None:
        """The stored block `block_hash` if a file holds it for exactly `block_key` (None: for
        the tokens its header names, which must hash to `block_hash`), else None.

        A file that is unreadable or does not match is deleted.
        """
        path = self._path(block_hash)
        try:
            file = path.open("rb", buffering=0)
        except FileNotFoundError:
            return None
        except OSError as error:
            logger.warning("KV disk cache: cannot read %s: %s", path, error)
            return None
        with file:
            buffer = self._take_buffer(os.fstat(file.fileno()).st_size)
            try:
                num_read = file.readinto(buffer)
            except OSError as error:
                self._give_back(buffer)
                logger.warning("KV disk cache: cannot read %s: %s", path, error)
                return None
        data = memoryview(buffer)[:num_read]
        payload, key, problem = self._check(data, block_hash, block_key)
        if payload is None or key is None:
            self._give_back(buffer)
            logger.warning("KV disk cache: ignoring %s: %s", path.name, problem)
            with self._lock:
                self.num_rejected += 1
            self._delete(block_hash)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # NOTE: the LRU order, kept on disk
        with self._lock:
            if block_hash in self._files:
                self._files.move_to_end(block_hash)
            else:  # another process wrote it
                self._files[block_hash] = len(data)
                self._num_bytes += len(data)
        return StoredBlock(block_hash, key, payload, path, buffer)

    def restore(self, stored: StoredBlock, block_id: int) -> None:
        """Copy a block read by `read` into KV block `block_id` of every layer."""
        offset = 0
        for tensor in self.kv_cache.storage:
            target = tensor[:, :, block_id]
            num_bytes = target.numel() * target.element_size()
            source = torch.frombuffer(
                stored.payload, dtype=torch.uint8, count=num_bytes, offset=offset
            )
            target.copy_(source.view(target.dtype).view(target.shape))
            offset += num_bytes
        self.num_loaded += 1
        self._give_back(stored.buffer)

    def save(self, block_hash: bytes, block_key: BlockKey, block_id: int) -> None:
        """Queue KV block `block_id` to be written as `block_hash` (engine thread; never waits).

        The block is copied now: once this returns, the block may be overwritten.
        """
        if not self.writes_enabled:
            return
        with self._lock:
            if block_hash in self._files or block_hash in self._queued:
                return
            self._queued.add(block_hash)
        tensors = [tensor[:, :, block_id].to("cpu", copy=True) for tensor in self.kv_cache.storage]
        header = {
            "version": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "block_hash": block_hash.hex(),
            **_key_fields(block_key),
            "layout": self.layout,
        }
        try:
            self._pending.put_nowait(_PendingWrite(block_hash, header, tensors))
        except queue.Full:
            with self._lock:
                self._queued.discard(block_hash)
            self.num_dropped += 1
            logger.debug("KV disk cache: writer busy, block %s not written", block_hash.hex())

    def flush(self) -> None:
        """Wait until every queued block is written (tests, shutdown)."""
        self._pending.join()

    def close(self) -> None:
        """Write what is queued, then stop the writer and reader threads."""
        self._readers.shutdown()
        if self._writer.is_alive():
            self._pending.put(None)
            self._writer.join()

    def _take_buffer(self, size: int) -> bytearray:
        """A buffer of at least `size` bytes: a pooled one, or a new one (rounded up, so the
        files of one model, whose headers differ by a few bytes, share their buffers)."""
        with self._lock:
            for index, buffer in enumerate(self._buffers):
                if len(buffer) >= size:
                    return self._buffers.pop(index)
        return bytearray(-(-size // 4096) * 4096 + 4096)

    def _give_back(self, buffer: bytearray) -> None:
        with self._lock:
            if (len(self._buffers) + 1) * len(buffer) <= MAX_POOLED_BYTES:
                self._buffers.append(buffer)

    def _path(self, block_hash: bytes) -> Path:
        name = block_hash.hex()
        return self.directory / name[:2] / f"{name}{SUFFIX}"

    def _scan(self) -> OrderedDict[bytes, int]:
        """The block files present, least recently used first; temporary files a crashed
        writer left (older than STALE_TEMPORARY_S: another process may be writing one now)
        are deleted."""
        stale = time.time() - STALE_TEMPORARY_S
        for path in self.directory.glob("*/.*.tmp"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < stale:
                    path.unlink()
        found = []
        for path in self.directory.glob(f"*/*{SUFFIX}"):
            try:
                stat = path.stat()
                block_hash = bytes.fromhex(path.stem)
            except (OSError, ValueError):
                continue
            found.append((stat.st_mtime_ns, block_hash, stat.st_size))
        found.sort()
        return OrderedDict((block_hash, size) for _, block_hash, size in found)

    def _check(
        self, data: memoryview, block_hash: bytes, block_key: BlockKey | None
    ) -> tuple[memoryview | None, BlockKey | None, str]:
        """The payload and key of a file's bytes for `block_hash` (and `block_key`, when given:
        None takes the key the header names), or (None, None, what is wrong)."""
        start = len(MAGIC) + _HEADER_LENGTH.size
        if len(data) < start or data[: len(MAGIC)] != MAGIC:
            return None, None, "not a KV block file (truncated or foreign)"
        (header_length,) = _HEADER_LENGTH.unpack_from(data, len(MAGIC))
        try:
            header = json.loads(bytes(data[start : start + header_length]))
        except ValueError:
            return None, None, "unreadable header (truncated?)"
        if not isinstance(header, dict):
            return None, None, "unreadable header"
        if header.get("version") != FORMAT_VERSION:
            return None, None, f"written by format version {header.get('version')!r}"
        if header.get("fingerprint") != self.fingerprint:
            return None, None, "written for another model or format"
        if header.get("layout") != self.layout:
            return None, None, "another KV layout"
        key = _key_from_header(header)
        # NOTE: the key must hash to the file's name, as the block manager's hashes are made:
        # a file renamed, or written for other tokens, never passes for this block.
        if (
            key is None
            or (block_key is not None and key != block_key)
            or header.get("block_hash") != block_hash.hex()
            or hash_blocks(key[0], list(key[1]), self.kv_cache.block_size) != [block_hash]
        ):
            return None, None, "holds other tokens (hash collision or another prefix)"
        payload = data[start + header_length :]
        if len(payload) != header.get("payload_bytes") or len(payload) != self.block_bytes:
            problem = f"payload of {len(payload)} bytes, expected {self.block_bytes} (truncated)"
            return None, None, problem
        if zlib.crc32(payload) != header.get("payload_crc32"):
            return None, None, "payload checksum mismatch (corrupt)"
        return payload, key, ""

    def _write_loop(self) -> None:
        while True:
            pending = self._pending.get()
            try:
                if pending is None:
                    return
                if self.writes_enabled:
                    self._write(pending)
            except Exception:  # NOTE: the writer must outlive any one block
                logger.exception("KV disk cache: writing a block failed")
            finally:
                if pending is not None:
                    with self._lock:
                        self._queued.discard(pending.block_hash)
                self._pending.task_done()

    def _write(self, pending: _PendingWrite) -> None:
        payload = b"".join(
            tensor.contiguous().view(torch.uint8).numpy().tobytes() for tensor in pending.tensors
        )
        header = dict(pending.header)
        header["payload_bytes"] = len(payload)
        header["payload_crc32"] = zlib.crc32(payload)
        header_bytes = json.dumps(header).encode()
        data = MAGIC + _HEADER_LENGTH.pack(len(header_bytes)) + header_bytes + payload
        path = self._path(pending.block_hash)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            # NOTE: parents too: a directory cleared while serving is made again, not a failure.
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(descriptor, "wb") as file:
                file.write(data)
            os.replace(temporary, path)
        except OSError as error:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            self.writes_enabled = False
            logger.warning(
                "KV disk cache: cannot write to %s (%s); the disk tier stops writing, "
                "prefix caching goes on in memory",
                self.directory,
                error,
            )
            return
        self.num_written += 1
        with self._lock:
            self._files[pending.block_hash] = len(data)
            self._num_bytes += len(data)
        self._evict()

    def _evict(self) -> None:
        while True:
            with self._lock:
                if self._num_bytes <= self.max_bytes or not self._files:
                    return
                block_hash = next(iter(self._files))
            self._delete(block_hash)

    def _delete(self, block_hash: bytes) -> None:
        with self._lock:
            self._num_bytes -= self._files.pop(block_hash, 0)
        try:
            self._path(block_hash).unlink(missing_ok=True)
        except OSError as error:
            logger.warning("KV disk cache: cannot delete %s: %s", block_hash.hex(), error)
