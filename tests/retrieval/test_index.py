"""retrieval.index: the persisted faiss index keyed by chunk id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retrieval.index import UnreadableIndexError, VectorIndex

MODEL = "model-a"


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def test_vectors_are_found_by_chunk_id_and_survive_a_reload(tmp_path) -> None:
    index = VectorIndex(tmp_path / "i.faiss", 3, MODEL)
    index.replace([], [10, 20], np.stack([unit(1, 0, 0), unit(0, 1, 0)]))
    again = VectorIndex(tmp_path / "i.faiss", 3, MODEL)
    assert again.ids() == {10, 20}
    assert again.search(unit(1, 0.1, 0), 2)[0][0] == 10


def test_replace_swaps_old_ids_for_new_ones_and_readers_see_it(tmp_path) -> None:
    writer = VectorIndex(tmp_path / "i.faiss", 3, MODEL)
    reader = VectorIndex(tmp_path / "i.faiss", 3, MODEL)
    writer.replace([], [1, 2], np.stack([unit(1, 0, 0), unit(0, 1, 0)]))
    assert reader.ids() == {1, 2}
    writer.replace([1, 2], [3], np.stack([unit(0, 0, 1)]))
    assert reader.ids() == {3}
    writer.remove([3])
    assert len(reader) == 0


def test_search_can_be_restricted_to_allowed_ids(tmp_path) -> None:
    index = VectorIndex(tmp_path / "i.faiss", 3, MODEL)
    index.replace([], [1, 2], np.stack([unit(1, 0, 0), unit(0.9, 0.1, 0)]))
    assert [i for i, _ in index.search(unit(1, 0, 0), 5, np.array([2]))] == [2]
    assert index.search(unit(1, 0, 0), 5, np.array([], dtype=np.int64)) == []


def test_an_index_of_another_dimension_is_refused_with_a_hint(tmp_path) -> None:
    VectorIndex(tmp_path / "i.faiss", 3, MODEL).replace([], [1], np.stack([unit(1, 0, 0)]))
    with pytest.raises(UnreadableIndexError, match="rebuild_index"):
        VectorIndex(tmp_path / "i.faiss", 4, MODEL).ids()


def test_a_corrupt_index_file_is_refused_with_a_hint(tmp_path) -> None:
    (tmp_path / "i.faiss").write_bytes(b"not a faiss index")
    with pytest.raises(UnreadableIndexError, match="rebuild_index"):
        len(VectorIndex(tmp_path / "i.faiss", 3, MODEL))


def test_reset_replaces_an_unreadable_file(tmp_path) -> None:
    (tmp_path / "i.faiss").write_bytes(b"garbage")
    index = VectorIndex(tmp_path / "i.faiss", 3, MODEL)
    index.reset([7], np.stack([unit(0, 1, 0)]))
    assert VectorIndex(tmp_path / "i.faiss", 3, MODEL).ids() == {7}


def test_verify_finds_vector_data_that_faiss_reads_without_complaint(tmp_path) -> None:
    path = tmp_path / "i.faiss"
    VectorIndex(path, 3, MODEL).replace([], [1, 2], np.stack([unit(1, 0, 0), unit(0, 1, 0)]))
    VectorIndex(path, 3, MODEL).verify()  # intact: no error
    data = bytearray(path.read_bytes())
    start = data.index(np.float32(1.0).tobytes())  # the first vector's data
    data[start : start + 4] = np.float32(7.5).tobytes()
    path.write_bytes(bytes(data))
    damaged = VectorIndex(path, 3, MODEL)
    assert damaged.ids() == {1, 2}  # faiss reads it
    with pytest.raises(UnreadableIndexError, match="1 vectors that are not unit length"):
        damaged.verify()


def test_an_index_made_by_another_embedding_model_is_refused_naming_both(tmp_path) -> None:
    VectorIndex(tmp_path / "i.faiss", 3, "model-a").replace([], [1], np.stack([unit(1, 0, 0)]))
    with pytest.raises(
        UnreadableIndexError, match="made by the embedding model 'model-a', but 'model-b'"
    ):
        VectorIndex(tmp_path / "i.faiss", 3, "model-b").ids()
    assert VectorIndex(tmp_path / "i.faiss", 3, "model-a").ids() == {1}


def test_an_index_without_a_model_record_is_adopted_and_recorded_at_its_next_write(
    tmp_path,
) -> None:
    index = VectorIndex(tmp_path / "i.faiss", 3, MODEL)
    index.replace([], [1], np.stack([unit(1, 0, 0)]))
    index.model_record.unlink()  # as an index written before records existed
    adopting = VectorIndex(tmp_path / "i.faiss", 3, "model-b")
    assert adopting.ids() == {1}
    assert adopting.recorded_model() is None
    adopting.replace([], [2], np.stack([unit(0, 1, 0)]))
    assert adopting.recorded_model() == "model-b"


def test_setting_an_index_aside_moves_its_model_record_with_it(tmp_path) -> None:
    index = VectorIndex(tmp_path / "i.faiss", 3, MODEL)
    index.replace([], [1], np.stack([unit(1, 0, 0)]))
    aside = Path(index.set_aside("unusable-1"))
    assert aside.exists() and aside.with_name(f"{aside.name}.model").exists()
    assert not index.path.exists() and not index.model_record.exists()
    assert index.ids() == set()
