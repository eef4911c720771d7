"""inference.provisioning and `manage.py prepare_models`, on the real packaged models."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from inference.provisioning import prepare_models, verify_chat_model


@pytest.mark.slow
def test_prepare_models_resolves_and_load_checks_both_models(chat_model_dir) -> None:
    prepared = prepare_models(None, None, settings.MODELS_DIR)
    chat, embedding = prepared
    assert (chat.role, chat.resolved.directory, chat.resolved.action) == (
        "chat",
        chat_model_dir,
        "cached",
    )
    assert "135M parameters" in chat.check
    assert embedding.check == "embedding dimension 384"


@pytest.mark.slow
def test_the_command_prints_what_it_did(chat_model_dir, capsys) -> None:
    call_command("prepare_models")
    out = capsys.readouterr().out
    assert "chat model (bundled): cached at" in out
    assert "embedding model (bundled): packaged at" in out


def test_the_command_turns_a_bad_source_into_a_command_error(settings, tmp_path) -> None:
    settings.CACHET_MODEL = str(tmp_path)  # a directory without a model in it
    with pytest.raises(CommandError, match="has no config.json"):
        call_command("prepare_models")


def test_a_model_with_broken_weights_fails_the_load_check(tmp_path, chat_model_dir) -> None:
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((chat_model_dir / name).read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(Exception, match="(?i)safetensors|header|deserializ"):
        verify_chat_model(tmp_path)
