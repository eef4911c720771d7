"""Embedding models side by side: ingestion throughput and query latency, same texts, same run.

For each embedding model (default: every packaged one, `inference.model_files`), on the first
`--passages` passages of each set (squad-dev in English, the Debian Reference set of `eval/` in
Chinese), embedded as ingestion embeds them (`encode(..., kind="passage")`: the model's batches,
niced on a short-lived thread), and on `--queries` of each set's questions embedded one at a time
as a search does (`kind="query"`):

- passages/s and tokens/s (each model's own tokenizer; prefixes and special tokens excluded);
- query p50 / p95 ms;
- each figure's ratio to the first model's (the baseline).

Models take turns round by round (`--rounds`, the median kept), so a machine that gets busier
during the run slows every model alike.

    python -m bench.embedders                 # 256 passages and 50 queries per set, 3 rounds
    python -m bench.embedders --json
    python -m bench.embedders --smoke         # 16 passages, 5 queries, 1 round: seconds
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.retrieval import percentiles
from bench.squad_questions import DEFAULT_SQUAD_DIR
from harness import CannotRunError, cpu_name, rounded, run_cli
from inference.model_files import PACKAGED_EMBEDDING_MODELS, ModelSourceError

logger = logging.getLogger(__name__)

CHINESE_SET = Path(__file__).resolve().parents[1] / "eval" / "debian-reference-zh"
PASSAGES = 256
QUERIES = 50
ROUNDS = 3
SMOKE_PASSAGES = 16
SMOKE_QUERIES = 5


def read_texts(directory: Path, name: str, limit: int) -> list[str]:
    """The `text` of the first `limit` rows of `directory/name` (a BEIR jsonl file)."""
    path = directory / name
    if not path.is_file():
        raise CannotRunError(f"{path} not found (a BEIR-layout set)")
    texts = []
    with path.open(encoding="utf-8") as rows:
        for line in rows:
            if line.strip():
                texts.append(json.loads(line)["text"])
            if len(texts) == limit:
                break
    return texts


def measure(
    models: Sequence[str], sets: dict[str, Path], passages: int, queries: int, rounds: int
) -> dict:
    from retrieval.embeddings import load_embedder

    texts = {
        name: (
            read_texts(path, "corpus.jsonl", passages),
            read_texts(path, "queries.jsonl", queries),
        )
        for name, path in sets.items()
    }
    embedders = {}
    load_seconds = {}
    for model in models:
        started = time.perf_counter()
        try:
            embedders[model] = load_embedder(model)
        except ModelSourceError as error:
            raise CannotRunError(str(error)) from None
        load_seconds[model] = time.perf_counter() - started
        for set_passages, set_queries in texts.values():  # warm-up: first-call costs
            embedders[model].encode(set_passages[:4])
            embedders[model].encode(set_queries[:2], kind="query")
        logger.info("%s loaded in %.1f s", model, load_seconds[model])
    passage_seconds: dict[tuple[str, str], list[float]] = {}
    query_ms: dict[tuple[str, str], list[float]] = {}
    for round_number in range(rounds):
        for model, embedder in embedders.items():
            for set_name, (set_passages, set_queries) in texts.items():
                started = time.perf_counter()
                embedder.encode(set_passages)
                passage_seconds.setdefault((model, set_name), []).append(
                    time.perf_counter() - started
                )
                for query in set_queries:
                    started = time.perf_counter()
                    embedder.encode([query], kind="query")
                    query_ms.setdefault((model, set_name), []).append(
                        (time.perf_counter() - started) * 1000
                    )
        logger.info("round %d of %d done", round_number + 1, rounds)
    rows = []
    for model, embedder in embedders.items():
        for set_name, (set_passages, _) in texts.items():
            seconds = statistics.median(passage_seconds[(model, set_name)])
            counted = embedder.tokenizer(set_passages, add_special_tokens=False)["input_ids"]
            num_tokens = sum(len(ids) for ids in counted)
            latencies = percentiles(query_ms[(model, set_name)])
            rows.append(
                {
                    "model": model,
                    "set": set_name,
                    "passages_per_s": len(set_passages) / seconds,
                    "tokens_per_s": num_tokens / seconds,
                    "tokens_per_passage": num_tokens / len(set_passages),
                    "query_p50_ms": latencies["p50"],
                    "query_p95_ms": latencies["p95"],
                    "load_s": load_seconds[model],
                }
            )
    baseline = {row["set"]: row for row in rows if row["model"] == models[0]}
    for row in rows:
        base = baseline[row["set"]]
        row["passages_ratio"] = row["passages_per_s"] / base["passages_per_s"]
        row["query_p50_ratio"] = row["query_p50_ms"] / base["query_p50_ms"]
    return {
        "cpu": cpu_name(),
        "passages": passages,
        "queries": queries,
        "rounds": rounds,
        "baseline": models[0],
        "rows": [
            {
                key: rounded(value, 3) if isinstance(value, float) else value
                for key, value in row.items()
            }
            for row in rows
        ],
    }


def format_table(report: dict) -> str:
    lines = [
        f"Embedding models, {report['passages']} passages and {report['queries']} queries per "
        f"set, median of {report['rounds']} rounds; {report['cpu']}",
        "",
        "| model | set | passages/s | tokens/s | tokens/passage | query p50 ms | query p95 ms "
        f"| passages/s vs {report['baseline']} | query p50 vs {report['baseline']} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['model']} | {row['set']} | {row['passages_per_s']} | {row['tokens_per_s']} "
            f"| {row['tokens_per_passage']} | {row['query_p50_ms']} | {row['query_p95_ms']} "
            f"| {row['passages_ratio']} | {row['query_p50_ratio']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        help="repeatable; the first is the baseline (default: every packaged model)",
    )
    parser.add_argument("--passages", type=int, default=None)
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--squad", type=Path, default=DEFAULT_SQUAD_DIR)
    parser.add_argument("--chinese", type=Path, default=CHINESE_SET)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    models = args.models or list(PACKAGED_EMBEDDING_MODELS)
    passages = args.passages or (SMOKE_PASSAGES if args.smoke else PASSAGES)
    queries = args.queries or (SMOKE_QUERIES if args.smoke else QUERIES)
    rounds = args.rounds or (1 if args.smoke else ROUNDS)
    sets = {"squad-dev (en)": args.squad, "debian-reference-zh": args.chinese}
    return run_cli(
        lambda: measure(models, sets, passages, queries, rounds),
        as_json=args.json,
        format_report=format_table,
        num_errors=lambda report: 0,
    )


if __name__ == "__main__":
    sys.exit(main())
