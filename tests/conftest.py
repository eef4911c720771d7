"""Shared fixtures. Models come from the real packaged files (HF_HUB_OFFLINE=1 in the suite)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def chat_model_dir() -> Path:
    """The bundled SmolLM2-135M-Instruct, converted once into the models cache of the data dir."""
    from django.conf import settings

    from inference.model_files import resolve_chat_model

    return resolve_chat_model(None, Path(settings.MODELS_DIR)).directory


@pytest.fixture(scope="session")
def embedding_model_dir() -> Path:
    from inference.model_files import resolve_embedding_model

    return resolve_embedding_model(None).directory
