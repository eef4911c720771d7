"""Fixtures of the engine tests; those shared with other folders are in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer


@pytest.fixture(scope="session")
def real_tokenizer(chat_model_dir):
    """The bundled chat model's tokenizer."""
    return AutoTokenizer.from_pretrained(str(chat_model_dir))


@pytest.fixture(scope="session")
def prepared_catalogue_model(catalogue_gguf):
    """Factory: `prepared_catalogue_model("qwen2.5-coder-0.5b-instruct")` -> the model's
    directory (config, tokenizer, the GGUF), prepared once in the data dir's models folder."""
    from django.conf import settings

    from inference.model_files import resolve_chat_model

    def prepare(name: str) -> Path:
        catalogue_gguf(name)  # fails, naming the fetch command, when the file is missing
        return resolve_chat_model(
            name, Path(settings.MODELS_DIR), model_cache=Path(settings.CACHET_MODEL_CACHE)
        ).directory

    return prepare
