"""bench.retrieval: the latency harness runs end to end at smoke sizes."""

from __future__ import annotations

import json
import random

import pytest

from bench.retrieval import load_texts, perturb, run_bench


@pytest.mark.django_db
def test_a_smoke_run_indexes_every_chunk_and_reports_latency(retriever, tmp_path) -> None:
    result = run_bench(tmp_path, num_chunks=60, unique=12, num_queries=3, corpus=None)
    assert (result["chunks"], result["unique_passages"], result["queries"]) == (60, 12, 3)
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p95"]
    assert result["query_embed_ms"]["p50"] > 0 and result["embed_passages_per_s"] > 0
    json.dumps(result)


def test_replicas_get_perturbed_text_and_the_original_is_kept() -> None:
    passages, queries = load_texts(None, 3, 2)
    assert len(passages) == 3 and len(queries) == 2
    rng = random.Random(0)
    assert perturb(passages[0], 0, rng) == passages[0]
    copy = perturb(passages[0], 2, rng)
    assert copy != passages[0] and copy.endswith("(copy 2)")
