"""Shared pieces of the fault tests in this folder: a throwaway Redis server that a
test may stop and start again, a document big enough that its ingestion takes a few seconds, what
a clean ingestion of it gives, and the ids a faiss index file holds."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from harness import free_port

REDIS_SERVER = shutil.which("redis-server")
# Words of the generated document: varied enough that chunks differ, cheap to make.
WORDS = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
)


class ThrowawayRedis:
    """`redis-server` on a free port with no persistence, owned by the test: never the shared one.

    `stop()` shuts it down (as an outage); `start()` runs it again on the same port, empty.
    """

    def __init__(self, directory: Path) -> None:
        if REDIS_SERVER is None:
            pytest.skip("redis-server is not installed")
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ping():
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def client(self):
        import redis

        return redis.Redis(port=self.port, socket_timeout=2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def __enter__(self) -> ThrowawayRedis:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def big_document(paragraphs: int) -> bytes:
    """Plain text of about one 200-token chunk per paragraph (the embedding model's tokenizer)."""
    parts = []
    for i in range(paragraphs):
        sentences = []
        for j in range(6):
            words = " ".join(WORDS[(i * 7 + j * 3 + k) % len(WORDS)] for k in range(12))
            sentences.append(f"Record {i}.{j} notes that {words} happened {i * j + 3} times.")
        parts.append(" ".join(sentences))
    return "\n\n".join(parts).encode()


def clean_chunk_texts(data: bytes, name: str) -> list[str]:
    """The chunk texts a clean ingestion of the file makes (extract and chunk, no embedding)."""
    from django.conf import settings

    from retrieval.chunking import chunk_sections
    from retrieval.embeddings import get_embedder
    from retrieval.extract import extract

    drafts = chunk_sections(
        extract(data, name),
        get_embedder().tokenizer,
        settings.CACHET_CHUNK_TOKENS,
        settings.CACHET_CHUNK_OVERLAP,
    )
    return [draft.text for draft in drafts]


def index_ids(path: Path) -> list[int]:
    """Every vector id in a faiss index file, repeats included (`VectorIndex.ids()` is a set)."""
    import faiss

    index = faiss.read_index(str(path))
    if index.ntotal == 0:
        return []
    return faiss.vector_to_array(index.id_map).tolist()


def wait_for(condition, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll `condition()` until it returns something truthy; that value, or fail after timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
