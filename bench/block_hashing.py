"""Prefix-cache block hashing, before and after SHA-256: the cost of hashing one prompt's blocks.

The engine hashes a prompt's full blocks once per request (`BlockManager`, kept on the
sequence), so this is scheduler work on the engine thread, which shares the interpreter with the
web server. "before" is the hash the engine used until the hashes had to agree across processes:
Python's `hash((parent hash, salt, token ids))`, process-dependent for a salt string
(PYTHONHASHSEED); "after" is `hash_blocks`, SHA-256 over the parent digest and the token ids as
4-byte little-endian ints. Both hash the same prompt into the same number of blocks; "block
manager" adds the engine's own path (a fresh sequence's prefix-cache lookup, hashing included).

    python -m bench.block_hashing              # 2,000 tokens, blocks of 16
    python -m bench.block_hashing --json --tokens 8000
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable

from harness import cpu_name, rounded, run_cli
from inference.engine.core.block_manager import BlockManager, hash_blocks, root_hash
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.sequence import Sequence

VOCAB_SIZE = 49_152  # SmolLM2's; only the ids' range matters
SALT = "user:42"


def python_hash_blocks(cache_salt: str | None, token_ids: list[int], block_size: int) -> list[int]:
    """The engine's block hashes before SHA-256: `hash()` of (parent, salt, block's token ids)."""
    hashes: list[int] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, cache_salt, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


def sha256_hash_blocks(cache_salt: str | None, token_ids: list[int], block_size: int) -> list:
    return hash_blocks(root_hash(cache_salt), token_ids, block_size)


def block_manager_lookup(cache_salt: str | None, token_ids: list[int], block_size: int) -> list:
    """A fresh request's prefix-cache lookup in an empty cache: hashes every full block."""
    manager = BlockManager(4, block_size)
    seq = Sequence("bench", token_ids, SamplingParams(), cache_salt=cache_salt)
    manager.get_computed_blocks(seq)
    return seq.block_hashes


def time_us(function: Callable[[], object], repeats: int) -> dict:
    """Median and best of `repeats` calls, in microseconds (after one warm-up call)."""
    function()
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        samples.append((time.perf_counter() - began) * 1e6)
    return {
        "median_us": rounded(statistics.median(samples), 1),
        "best_us": rounded(min(samples), 1),
    }


def run_bench(*, num_tokens: int = 2000, block_size: int = 16, repeats: int = 500) -> dict:
    if num_tokens < block_size or block_size < 1 or repeats < 1:
        raise ValueError("tokens must fill at least one block; block size and repeats >= 1")
    rng = random.Random(0)
    token_ids = [rng.randrange(VOCAB_SIZE) for _ in range(num_tokens)]
    ways = {
        "before (hash of tuples)": python_hash_blocks,
        "after (SHA-256)": sha256_hash_blocks,
        "after, block manager": block_manager_lookup,
    }
    results = {}
    for name, function in ways.items():
        for salt in (None, SALT):
            timing = time_us(lambda f=function, s=salt: f(s, token_ids, block_size), repeats)
            results[f"{name}, salt {'none' if salt is None else 'set'}"] = timing
    return {
        "config": {
            "tokens": num_tokens,
            "block_size": block_size,
            "blocks": num_tokens // block_size,
            "repeats": repeats,
            "cpu": cpu_name(),
        },
        "results": results,
    }


def format_report(report: dict) -> str:
    config = report["config"]
    lines = [
        f"{config['tokens']} tokens in {config['blocks']} blocks of {config['block_size']}, "
        f"{config['repeats']} repeats, {config['cpu']}",
        "",
        f"{'hashing':<38} {'median µs':>10} {'best µs':>9}",
    ]
    for name, timing in report["results"].items():
        lines.append(f"{name:<38} {timing['median_us']:>10.1f} {timing['best_us']:>9.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.block_hashing", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--tokens", type=int, default=2000, help="prompt length (default 2000)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens a block (default 16)")
    parser.add_argument("--repeats", type=int, default=500, help="timed calls (default 500)")
    args = parser.parse_args(argv)
    if args.block_size < 1 or args.tokens < args.block_size or args.repeats < 1:
        parser.error("--tokens must fill a block; --block-size and --repeats at least 1")
    return run_cli(
        lambda: run_bench(num_tokens=args.tokens, block_size=args.block_size, repeats=args.repeats),
        as_json=args.json,
        format_report=format_report,
        num_errors=lambda report: 0,
    )


if __name__ == "__main__":
    sys.exit(main())
