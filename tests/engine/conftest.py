"""Fixtures of the engine tests; those shared with other folders are in tests/conftest.py."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer


@pytest.fixture(scope="session")
def real_tokenizer(chat_model_dir):
    """The bundled chat model's tokenizer."""
    return AutoTokenizer.from_pretrained(str(chat_model_dir))
