"""The GGUF header parser against the `gguf` package's own reader, and its refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from inference.engine.gguf_file import GGUFFileError, StringArray, open_gguf
from inference.model_files import bundled_chat_gguf
from tests.engine.broken_gguf import truncated_copy, with_tensor_type


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    return bundled_chat_gguf()


def test_the_header_reads_as_the_gguf_packages_reader_reads_it(smollm2_gguf) -> None:
    # NOTE: one file: the reader takes ~1 min of CPU on the larger vocabularies (the reason this
    # parser exists), and the layout is the same for every architecture.
    parsed = open_gguf(smollm2_gguf)
    reference = GGUFReader(smollm2_gguf)
    assert list(parsed.tensors) == [tensor.name for tensor in reference.tensors]
    for tensor in reference.tensors:
        mine = parsed.tensors[tensor.name]
        assert mine.ggml_type == tensor.tensor_type
        assert mine.shape == tuple(int(n) for n in reversed(tensor.shape))
        assert (mine.offset, mine.num_bytes) == (tensor.data_offset, tensor.n_bytes)
        assert np.array_equal(mine.data.reshape(-1), tensor.data.reshape(-1).view(np.uint8))
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's own entries (version, counts), not metadata
        value = parsed.metadata[key]
        if isinstance(value, StringArray):
            assert field.types[:2] == [GGUFValueType.ARRAY, GGUFValueType.STRING]
            assert value.count == len(field.data)
        elif isinstance(value, np.ndarray):
            assert value.tolist() == list(field.contents())
        else:
            assert value == field.contents(), key
    assert parsed.tensor_bytes == sum(tensor.n_bytes for tensor in reference.tensors)


def test_a_file_cut_inside_the_tensor_data_names_the_first_tensor_cut(
    smollm2_gguf, tmp_path
) -> None:
    size = smollm2_gguf.stat().st_size
    broken = truncated_copy(smollm2_gguf, tmp_path / "half.gguf", size // 2)
    with pytest.raises(GGUFFileError) as caught:
        open_gguf(broken)
    message = str(caught.value)
    assert message.startswith(f"{broken}: the file is truncated: tensor ")
    assert f"the file has {size // 2} bytes" in message


def test_a_file_cut_inside_the_header_says_where(smollm2_gguf, tmp_path) -> None:
    broken = truncated_copy(smollm2_gguf, tmp_path / "header.gguf", 4096)
    with pytest.raises(GGUFFileError, match=r"header is truncated or corrupt near byte \d+"):
        open_gguf(broken)


def test_a_type_id_that_ggml_does_not_define_names_the_tensor_and_the_id(
    smollm2_gguf, tmp_path
) -> None:
    broken = with_tensor_type(smollm2_gguf, tmp_path / "t.gguf", "blk.3.ffn_up.weight", 99)
    with pytest.raises(GGUFFileError) as caught:
        open_gguf(broken)
    assert str(caught.value) == (
        f"{broken}: tensor 'blk.3.ffn_up.weight' has quantization type id 99, "
        "which ggml does not define"
    )


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"", "the file is empty"), (b"PK\x03\x04 a zip file", "bad magic bytes")],
)
def test_files_that_are_not_gguf_are_refused(tmp_path, content, reason) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFFileError, match=f"^{path}: .*{reason}"):
        open_gguf(path)


def test_released_pages_read_back_the_same_bytes(smollm2_gguf) -> None:
    parsed = open_gguf(smollm2_gguf)
    tensor = parsed.tensors["blk.0.ffn_down.weight"]
    before = tensor.data.copy()
    parsed.release(tensor)
    assert np.array_equal(tensor.data, before)
