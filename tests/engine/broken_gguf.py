"""Broken copies of real GGUF files, for the tests of bad input: cut short, or with one header
value patched in place (a tensor's type id, a metadata number or string).

Offsets come from the `gguf` package's own reader, not from the parser under test.
"""

from __future__ import annotations

import functools
import shutil
import struct
from pathlib import Path

from gguf import GGUFReader, GGUFValueType


def truncated_copy(source: Path, target: Path, num_bytes: int) -> Path:
    """The first `num_bytes` of `source`."""
    with source.open("rb") as reader, target.open("wb") as writer:
        writer.write(reader.read(num_bytes))
    return target


def with_tensor_type(source: Path, target: Path, tensor_name: str, type_id: int) -> Path:
    """A copy of `source` whose tensor `tensor_name` claims quantization type `type_id`."""
    reader = _reader(source)
    [tensor] = [t for t in reader.tensors if t.name == tensor_name]
    name_bytes = len(tensor_name.encode())
    # tensor info: name length (8), name, dimension count (4), dimensions (8 each), type (4)
    type_offset = tensor.field.offset + 8 + name_bytes + 4 + 8 * len(tensor.shape)
    return _patched(source, target, type_offset, struct.pack("<I", type_id))


def with_metadata_value(source: Path, target: Path, key: str, value: int | str) -> Path:
    """A copy of `source` whose metadata `key` (a uint32, or a string of the same length) holds
    `value`."""
    field = _reader(source).fields[key]
    # key/value: key length (8), key, value type (4), then the value (a string: length (8) first)
    value_offset = field.offset + 8 + len(key.encode()) + 4
    if isinstance(value, str):
        if field.types != [GGUFValueType.STRING] or len(value) != len(field.contents()):
            raise ValueError(f"{key} is not a string of {len(value)} characters")
        return _patched(source, target, value_offset + 8, value.encode())
    if field.types != [GGUFValueType.UINT32]:
        raise ValueError(f"{key} is not a uint32")
    return _patched(source, target, value_offset, struct.pack("<I", value))


@functools.cache
def _reader(source: Path) -> GGUFReader:
    """One reader per source file: it takes seconds to parse a vocabulary."""
    return GGUFReader(source)


def _patched(source: Path, target: Path, offset: int, data: bytes) -> Path:
    shutil.copyfile(source, target)
    with target.open("r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    return target
