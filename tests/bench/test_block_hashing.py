"""bench.block_hashing at a small size: both hashings time the same prompt, side by side."""

from __future__ import annotations

import json

from bench import block_hashing as bench


def test_a_small_run_times_the_python_and_the_sha256_hashes_of_the_same_blocks() -> None:
    report = bench.run_bench(num_tokens=64, block_size=16, repeats=3)
    json.dumps(report)
    assert report["config"]["blocks"] == 4
    assert len(report["results"]) == 6
    assert all(timing["best_us"] > 0 for timing in report["results"].values())
    table = bench.format_report(report)
    assert "before (hash of tuples)" in table and "after (SHA-256)" in table


def test_both_hashings_make_one_hash_per_full_block() -> None:
    tokens = list(range(40))
    assert len(bench.python_hash_blocks("s", tokens, 16)) == 2
    assert len(bench.sha256_hash_blocks("s", tokens, 16)) == 2
    assert bench.block_manager_lookup("s", tokens, 16) == bench.sha256_hash_blocks("s", tokens, 16)
