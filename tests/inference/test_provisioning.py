"""inference.provisioning and `manage.py prepare_models`, on the real packaged models."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from inference.provisioning import prepare_models, verify_chat_model


@pytest.mark.real_weights
def test_prepare_models_resolves_and_load_checks_both_models(chat_model_dir) -> None:
    prepared = prepare_models([settings.CACHET_MODEL], None, settings.MODELS_DIR)
    chat, embedding = prepared
    assert (chat.role, chat.resolved.directory, chat.resolved.action) == (
        "chat",
        chat_model_dir,
        "cached",
    )
    assert ".gguf (gguf): " in chat.check  # loaded as the engine serves it
    assert "generated 4 tokens: " in chat.check
    assert embedding.check == "embedding dimension 384"


@pytest.mark.real_weights
def test_the_command_prints_what_it_did(chat_model_dir, capsys) -> None:
    call_command("prepare_models")
    out = capsys.readouterr().out
    assert "chat model (smollm2-135m-instruct): cached at" in out
    assert "embedding model (multilingual-e5-small): packaged at" in out


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


@pytest.mark.real_weights
def test_the_command_prepares_the_models_named_instead_of_cachet_model(
    chat_model_dir, settings, tmp_path, capsys
) -> None:
    settings.CACHET_MODEL = str(tmp_path)  # would fail: --model replaces it
    call_command("prepare_models", "--model", "smollm2-135m-instruct")
    assert "chat model (smollm2-135m-instruct): cached at" in capsys.readouterr().out


def test_the_command_refuses_an_unknown_model_name_with_the_catalogue() -> None:
    with pytest.raises(CommandError, match="--model: no model named 'qwen-9000' in the catalogue"):
        call_command("prepare_models", "--model", "qwen-9000")


def test_the_command_lists_the_catalogue_with_what_is_fetched_and_the_default(
    settings, tmp_path, capsys
) -> None:
    settings.CACHET_MODEL_CACHE = tmp_path  # nothing fetched here
    settings.CACHET_MODEL = "gemma-3-270m"
    call_command("prepare_models", "--list")
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["name", "params", "format", "size", "kind", "fetched"]
    table = {row.split()[0]: row.split() for row in rows if row.strip()}
    assert table["qwen2.5-coder-1.5b-instruct"] == [
        *("qwen2.5-coder-1.5b-instruct", "1.5B", "GGUF", "Q4_K_M", "1,117", "MB"),
        *("instruct", "no", "default"),
    ]
    assert table["gemma-3-270m"][-3:] == ["base", "no", "CACHET_MODEL"]
    assert table["smollm2-135m-instruct"][-2:] == ["instruct", "installed"]
    assert rows[-1] == f"models cache: {tmp_path} (CACHET_MODEL_CACHE)"
