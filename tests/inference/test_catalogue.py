"""inference.catalogue: its entries, name lookup, where the cache is and what counts as fetched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from inference import catalogue
from inference.catalogue import UnknownCatalogueModel, WheelParts

SPLIT_MODELS = [
    model for model in catalogue.CATALOGUE.values() if isinstance(model.origin, WheelParts)
]


@pytest.mark.parametrize("model", SPLIT_MODELS, ids=lambda model: model.name)
def test_every_split_entry_has_parts_that_add_up_to_its_size(model) -> None:
    sizes = model.origin.part_sizes(model.size)
    assert sum(sizes) == model.size
    assert 0 < sizes[-1] <= model.origin.part_size
    assert len({distribution for distribution, _ in model.origin.parts}) == len(sizes)
    assert len(model.sha256) == 64 and set(model.sha256) <= set("0123456789abcdef")
    assert model.file_name.endswith(".gguf")


def test_the_default_model_is_an_instruct_model_of_the_catalogue() -> None:
    default = catalogue.get_model(catalogue.DEFAULT_CHAT_MODEL)
    assert default.is_instruct and default.kind == "instruct"
    assert isinstance(default.origin, WheelParts)


def test_gemma_is_listed_as_a_base_model() -> None:
    assert catalogue.get_model("gemma-3-270m").kind == "base"


def test_an_unknown_name_is_refused_with_the_catalogue_listed() -> None:
    with pytest.raises(UnknownCatalogueModel) as caught:
        catalogue.get_model("qwen2.5-coder-7b-instruct")
    assert str(caught.value) == (
        "no model named 'qwen2.5-coder-7b-instruct' in the catalogue; the catalogue has: "
        "smollm2-135m-instruct, qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct, "
        "gemma-3-270m"
    )


@pytest.mark.parametrize(
    ("source", "is_name"),
    [
        ("qwen2.5-coder-1.5b-instruct", True),
        ("qwen-typo", True),
        ("Qwen/Qwen2.5-Coder-1.5B-Instruct", False),
        ("/models/qwen", False),
        ("./qwen", False),
        ("~/qwen", False),
        ("qwen.gguf", False),
    ],
)
def test_one_word_sources_are_catalogue_names_hub_ids_and_paths_are_not(source, is_name) -> None:
    assert catalogue.names_a_catalogue_model(source) is is_name


def test_the_cache_is_cachet_model_cache_else_under_xdg_cache_home_else_home(tmp_path) -> None:
    assert catalogue.cache_dir({"CACHET_MODEL_CACHE": str(tmp_path)}) == tmp_path.resolve()
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert catalogue.cache_dir(xdg) == tmp_path / "xdg" / "cachet" / "models"
    assert catalogue.cache_dir({}) == Path.home() / ".cache" / "cachet" / "models"


def test_the_bundled_file_is_what_the_catalogue_records() -> None:
    model = catalogue.get_model(catalogue.BUNDLED_CHAT_MODEL)
    path = catalogue.fetched_path(model.name)
    assert path is not None and path.name == model.file_name
    assert path.stat().st_size == model.size
    assert hashlib.sha256(path.read_bytes()).hexdigest() == model.sha256


def test_a_file_counts_as_fetched_only_with_its_size_and_a_matching_marker(tmp_path) -> None:
    model = catalogue.get_model("gemma-3-270m")
    assert catalogue.fetched_path(model.name, tmp_path) is None
    path = catalogue.cached_file(model, tmp_path)
    path.parent.mkdir(parents=True)
    with path.open("wb") as handle:
        handle.truncate(model.size)  # the right size, sparse: checking it must not read it
    assert catalogue.fetched_path(model.name, tmp_path) is None  # no marker
    marker = catalogue.verified_marker(path)
    marker.write_text(json.dumps(catalogue.file_fingerprint(model, path)))
    assert catalogue.fetched_path(model.name, tmp_path) == path
    marker.write_text('{"sha256": ')  # cut short by a crash
    assert catalogue.fetched_path(model.name, tmp_path) is None


def test_the_real_weight_tests_models_are_fetched_and_are_gguf_files(catalogue_gguf) -> None:
    for name in ("qwen2.5-coder-0.5b-instruct", "gemma-3-270m"):
        path = catalogue_gguf(name)
        assert path.stat().st_size == catalogue.get_model(name).size
        with path.open("rb") as handle:
            assert handle.read(4) == b"GGUF"
