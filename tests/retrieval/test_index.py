"""retrieval.index: the persisted faiss index keyed by chunk id."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.index import UnreadableIndexError, VectorIndex


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def test_vectors_are_found_by_chunk_id_and_survive_a_reload(tmp_path) -> None:
    index = VectorIndex(tmp_path / "i.faiss", 3)
    index.replace([], [10, 20], np.stack([unit(1, 0, 0), unit(0, 1, 0)]))
    again = VectorIndex(tmp_path / "i.faiss", 3)
    assert again.ids() == {10, 20}
    assert again.search(unit(1, 0.1, 0), 2)[0][0] == 10


def test_replace_swaps_old_ids_for_new_ones_and_readers_see_it(tmp_path) -> None:
    writer = VectorIndex(tmp_path / "i.faiss", 3)
    reader = VectorIndex(tmp_path / "i.faiss", 3)
    writer.replace([], [1, 2], np.stack([unit(1, 0, 0), unit(0, 1, 0)]))
    assert reader.ids() == {1, 2}
    writer.replace([1, 2], [3], np.stack([unit(0, 0, 1)]))
    assert reader.ids() == {3}
    writer.remove([3])
    assert len(reader) == 0


def test_search_can_be_restricted_to_allowed_ids(tmp_path) -> None:
    index = VectorIndex(tmp_path / "i.faiss", 3)
    index.replace([], [1, 2], np.stack([unit(1, 0, 0), unit(0.9, 0.1, 0)]))
    assert [i for i, _ in index.search(unit(1, 0, 0), 5, np.array([2]))] == [2]
    assert index.search(unit(1, 0, 0), 5, np.array([], dtype=np.int64)) == []


def test_an_index_of_another_dimension_is_refused_with_a_hint(tmp_path) -> None:
    VectorIndex(tmp_path / "i.faiss", 3).replace([], [1], np.stack([unit(1, 0, 0)]))
    with pytest.raises(UnreadableIndexError, match="rebuild_index"):
        VectorIndex(tmp_path / "i.faiss", 4).ids()


def test_a_corrupt_index_file_is_refused_with_a_hint(tmp_path) -> None:
    (tmp_path / "i.faiss").write_bytes(b"not a faiss index")
    with pytest.raises(UnreadableIndexError, match="rebuild_index"):
        len(VectorIndex(tmp_path / "i.faiss", 3))


def test_reset_replaces_an_unreadable_file(tmp_path) -> None:
    (tmp_path / "i.faiss").write_bytes(b"garbage")
    index = VectorIndex(tmp_path / "i.faiss", 3)
    index.reset([7], np.stack([unit(0, 1, 0)]))
    assert VectorIndex(tmp_path / "i.faiss", 3).ids() == {7}


def test_verify_finds_vector_data_that_faiss_reads_without_complaint(tmp_path) -> None:
    path = tmp_path / "i.faiss"
    VectorIndex(path, 3).replace([], [1, 2], np.stack([unit(1, 0, 0), unit(0, 1, 0)]))
    VectorIndex(path, 3).verify()  # intact: no error
    data = bytearray(path.read_bytes())
    start = data.index(np.float32(1.0).tobytes())  # the first vector's data
    data[start : start + 4] = np.float32(7.5).tobytes()
    path.write_bytes(bytes(data))
    damaged = VectorIndex(path, 3)
    assert damaged.ids() == {1, 2}  # faiss reads it
    with pytest.raises(UnreadableIndexError, match="1 vectors that are not unit length"):
        damaged.verify()
