"""The GGUF container: its metadata and tensor table, over a read-only memory map of the file.

Only the header is parsed; a tensor's bytes are a view of the mapping, read from disk when they
are used. Every way a file can be broken is refused here with its path and the reason
(`GGUFFileError`): bad magic or version, a header cut short, a tensor of a type id that ggml does
not define, a tensor whose bytes run past the end of the file (a truncated download).

NOTE: not `gguf.GGUFReader`, although the names and types are the `gguf` package's: the reader
builds two numpy views for every string of the vocabulary and merge tables (300,000 of them for
Qwen2.5), through np.memmap's Python-level hooks, which took 5 to 15 s of CPU per load on this
machine. Strings are skipped here, 0.2 s for the same file; tests/engine/test_gguf_file.py checks
this parser against the reader on the real files.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32  # llama.cpp's, when general.alignment is absent

# metadata value type id -> struct format (8 = string and 9 = array are read separately)
_SCALAR_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NUMPY_TYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?"}
_NUMPY_TYPES |= {10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


class GGUFFileError(ValueError):
    """A GGUF file cannot be used; the message names the file and the reason."""


@dataclass(frozen=True, slots=True)
class StringArray:
    """A metadata array of strings, by its length only (the vocabulary, the merges)."""

    count: int


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor of the file: `shape` in torch order ([rows, columns] for a matrix)."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int  # in the file
    num_bytes: int
    data: np.ndarray  # uint8 [rows, bytes per row], a view of the mapping

    @property
    def is_float(self) -> bool:
        return self.ggml_type in FLOAT_TYPES


@dataclass(frozen=True, slots=True)
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    mapping: mmap.mmap

    def release(self, tensor: GGUFTensor) -> None:
        """Drop `tensor`'s pages from this process's memory (they stay in the page cache).

        NOTE: a loader that reads every tensor once would otherwise keep the whole file resident
        until the mapping closes, on top of the weights it built: +1.1 GB of peak RSS for
        Qwen2.5-1.5B.
        """
        start = tensor.offset - tensor.offset % mmap.PAGESIZE
        length = tensor.offset + tensor.num_bytes - start
        if hasattr(mmap, "MADV_DONTNEED") and length > 0:
            self.mapping.madvise(mmap.MADV_DONTNEED, start, length)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def tensor_bytes(self) -> int:
        """The bytes of all tensors, as stored (the file minus its header)."""
        return sum(tensor.num_bytes for tensor in self.tensors.values())


def open_gguf(path: str | Path) -> GGUFFile:
    """Parse the header of the GGUF file at `path`; GGUFFileError if it is not a usable one."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            if path.stat().st_size == 0:
                raise GGUFFileError(f"{path}: the file is empty, not a GGUF model")
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as error:
        raise GGUFFileError(f"{path}: cannot be read ({error})") from None
    return _Parser(path, mapping).parse()


class _Parser:
    def __init__(self, path: Path, mapping: mmap.mmap) -> None:
        self.path = path
        self.mapping = mapping
        self.blob = np.frombuffer(mapping, dtype=np.uint8)
        self.pos = 0

    def parse(self) -> GGUFFile:
        if bytes(self.blob[:4]) != GGUF_MAGIC:
            raise GGUFFileError(f"{self.path}: not a GGUF file (bad magic bytes)")
        try:
            version, num_tensors, num_fields = self._unpack("<IQQ", 4)
            if version not in SUPPORTED_VERSIONS:
                raise GGUFFileError(
                    f"{self.path}: GGUF version {version} is not supported "
                    f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))})"
                )
            metadata = {}
            for _ in range(num_fields):
                key = self._string()
                (value_type,) = self._unpack("<I")
                metadata[key] = self._value(value_type, key)
            infos = [self._tensor_info() for _ in range(num_tensors)]
        except (struct.error, UnicodeDecodeError, OverflowError, MemoryError):
            raise GGUFFileError(
                f"{self.path}: the GGUF header is truncated or corrupt near byte {self.pos} "
                f"(the file has {len(self.blob)} bytes)"
            ) from None
        alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFFileError(f"{self.path}: general.alignment {alignment} is not a power of 2")
        data_start = -(-self.pos // alignment) * alignment
        tensors = {}
        for name, shape, type_id, relative_offset in infos:
            if name in tensors:
                raise GGUFFileError(f"{self.path}: tensor {name!r} appears twice")
            tensors[name] = self._tensor(name, shape, type_id, data_start + relative_offset)
        return GGUFFile(self.path, version, metadata, tensors, self.mapping)

    def _unpack(self, fmt: str, advance_first: int = 0) -> tuple[Any, ...]:
        self.pos += advance_first
        values = struct.unpack_from(fmt, self.mapping, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (length,) = self._unpack("<Q")
        end = self.pos + length
        if end > len(self.blob):
            raise struct.error("string past the end of the file")
        text = self.mapping[self.pos : end].decode("utf-8")
        self.pos = end
        return text

    def _value(self, value_type: int, key: str) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self._unpack(_SCALAR_FORMATS[value_type])[0]
        if value_type == _STRING:
            return self._string()
        if value_type != _ARRAY:
            raise GGUFFileError(f"{self.path}: metadata {key!r} has unknown type {value_type}")
        element_type, count = self._unpack("<IQ")
        if element_type == _STRING:
            # NOTE: walked, not decoded: see the module docstring.
            for _ in range(count):
                (length,) = self._unpack("<Q")
                self.pos += length
            if self.pos > len(self.blob):
                raise struct.error("string array past the end of the file")
            return StringArray(count)
        if element_type not in _NUMPY_TYPES:
            raise GGUFFileError(
                f"{self.path}: metadata {key!r} is an array of unsupported type {element_type}"
            )
        dtype = np.dtype(_NUMPY_TYPES[element_type])
        end = self.pos + count * dtype.itemsize
        if end > len(self.blob):
            raise struct.error("array past the end of the file")
        values = self.blob[self.pos : end].view(dtype)
        self.pos = end
        return values

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        (num_dims,) = self._unpack("<I")
        dims = self._unpack(f"<{num_dims}Q")
        type_id, offset = self._unpack("<IQ")
        # NOTE: ggml lists dimensions fastest-varying first; torch order is the reverse.
        return name, tuple(reversed(dims)), type_id, offset

    def _tensor(self, name: str, shape: tuple[int, ...], type_id: int, offset: int) -> GGUFTensor:
        try:
            tensor_type = GGMLQuantizationType(type_id)
        except ValueError:
            raise GGUFFileError(
                f"{self.path}: tensor {name!r} has quantization type id {type_id}, "
                "which ggml does not define"
            ) from None
        block_size, block_bytes = GGML_QUANT_SIZES[tensor_type]
        row_length = shape[-1] if shape else 1
        if row_length % block_size:
            raise GGUFFileError(
                f"{self.path}: tensor {name!r} has rows of {row_length} values, not a multiple "
                f"of the {block_size}-value blocks of {tensor_type.name}"
            )
        num_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        row_bytes = row_length // block_size * block_bytes
        num_bytes = num_rows * row_bytes
        if offset + num_bytes > len(self.blob):
            raise GGUFFileError(
                f"{self.path}: the file is truncated: tensor {name!r} ends at byte "
                f"{offset + num_bytes}, the file has {len(self.blob)} bytes"
            )
        data = self.blob[offset : offset + num_bytes].reshape(num_rows, row_bytes)
        return GGUFTensor(name, tensor_type, shape, offset, num_bytes, data)
