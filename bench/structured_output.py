"""Structured outputs: what grammar-constrained decoding costs per token, beside free decoding.

One engine (default: the app's default model, qwen2.5-coder-1.5b-instruct, in its GGUF formats)
answers one JSON-Schema question greedily, one request at a time:

- constrained: `response_format`-style decoding under the schema's grammar, until the document
  ends;
- free: the same prompt without the grammar, forced to the same number of tokens (ignore_eos),
  so both decode the same count of tokens over the same context lengths.

Each is run `--repeats` times, alternating, after a warm-up of each (prefix cache warm, grammar
compiled); reported: median decode tok/s (after the first token) of each and their ratio, the
grammar's first and cached compile times, how many constrained documents ended within
max_tokens and whether every one of those validated (one cut by max_tokens is unfinished by
definition; the benchmark exits 1 only for a finished document that does not validate), and a
mixed batch: `--batch` requests, half constrained, against the same batch all free, in output
tokens per second of wall time.

    python -m bench.structured_output                 # the table (~5 minutes on 2 cores)
    python -m bench.structured_output --json
    python -m bench.structured_output --smoke         # SmolLM2, 2 repeats, batch of 2
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

from harness import cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL, DEFAULT_CHAT_MODEL

logger = logging.getLogger(__name__)

REPEATS = 5
SMOKE_REPEATS = 2
BATCH = 4
SMOKE_BATCH = 2
MAX_TOKENS = 256
SCHEMA = {
    "type": "object",
    "properties": {
        "books": {
            "type": "array",
            "minItems": 3,
            "maxItems": 6,
            "items": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 80},
                    "author": {"type": "string", "maxLength": 60},
                    "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
                    "genres": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                },
                "required": ["title", "author", "year", "genres"],
            },
        }
    },
    "required": ["books"],
}
QUESTION = (
    "List five classic novels as JSON: an object with a `books` array whose items have title, "
    "author, year and genres."
)


def run_benchmark(
    model: str, *, models_dir: Path, quantization: str, repeats: int, batch: int
) -> dict:
    import jsonschema_rs

    from inference.engine import Engine, EngineConfig, SamplingParams, StructuredOutput
    from inference.model_files import resolve_chat_model

    model_dir = resolve_chat_model(model, models_dir).directory
    engine = Engine(
        EngineConfig(model_dir, quantization=quantization, max_model_len=2048, kv_cache_mb=256)
    )
    try:
        prompt = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTION}], add_generation_prompt=True
        )
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        output = StructuredOutput.json_schema(SCHEMA)
        started = time.perf_counter()
        engine.compile_structured_output(output)
        first_compile_s = time.perf_counter() - started
        started = time.perf_counter()
        engine.compile_structured_output(output)
        cached_compile_s = time.perf_counter() - started

        bound = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, structured_output=output)
        [warm] = engine.generate([prompt], bound)
        num_tokens = warm.usage.completion_tokens
        free = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
        engine.generate([prompt], free)
        bound_tok_s, free_tok_s, documents = [], [], [warm]
        for _ in range(repeats):
            [result] = engine.generate([prompt], bound)
            bound_tok_s.append(result.usage.tokens_per_s)
            documents.append(result)
            [result] = engine.generate([prompt], free)
            free_tok_s.append(result.usage.tokens_per_s)

        half = batch // 2
        mixed = [bound] * half + [free] * (batch - half)
        mixed_tok_s, mixed_documents = _batch_throughput(engine, prompt, mixed)
        all_free_tok_s, _ = _batch_throughput(engine, prompt, [free] * batch)
        documents += mixed_documents
    finally:
        engine.shutdown()
    validator = jsonschema_rs.validator_for(SCHEMA)
    finished = [document for document in documents if document.finish_reason == "stop"]
    bound_median, free_median = statistics.median(bound_tok_s), statistics.median(free_tok_s)
    return {
        "cpu": cpu_name(),
        "model": model,
        "quantization": quantization,
        "completion_tokens": num_tokens,
        "repeats": repeats,
        "first_compile_ms": rounded(first_compile_s * 1e3, 2),
        "cached_compile_ms": rounded(cached_compile_s * 1e3, 3),
        "constrained_tok_s": rounded(bound_median, 2),
        "free_tok_s": rounded(free_median, 2),
        "ratio": rounded(bound_median / free_median, 3),
        "batch": batch,
        "mixed_batch_tok_s": rounded(mixed_tok_s, 2),
        "free_batch_tok_s": rounded(all_free_tok_s, 2),
        "batch_ratio": rounded(mixed_tok_s / all_free_tok_s, 3),
        "num_documents": len(documents),
        "num_finished": len(finished),
        "finished_all_valid": all(_is_valid(validator, document.text) for document in finished),
        "sample": warm.text,
    }


def _batch_throughput(engine, prompt: list[int], params: list) -> tuple[float, list]:
    """Output tokens per second of wall time for one batch, and its constrained results."""
    started = time.perf_counter()
    results = engine.generate([prompt] * len(params), params)
    elapsed = time.perf_counter() - started
    num_tokens = sum(result.usage.completion_tokens for result in results)
    documents = [r for r, p in zip(results, params, strict=True) if p.structured_output]
    return num_tokens / elapsed, documents


def _is_valid(validator, text: str) -> bool:
    try:
        return bool(validator.is_valid(json.loads(text)))
    except json.JSONDecodeError:
        return False


def format_table(report: dict) -> str:
    return "\n".join(
        [
            f"{report['model']} ({report['quantization']}), {report['completion_tokens']} greedy "
            f"tokens, median of {report['repeats']}, {report['cpu']}",
            "",
            "| decoding | tok/s | ratio |",
            "|---|---:|---:|",
            f"| free (single stream) | {report['free_tok_s']} | 1.0 |",
            f"| JSON Schema (single stream) | {report['constrained_tok_s']} | {report['ratio']} |",
            f"| {report['batch']} free (batch, tok/s of wall time) | "
            f"{report['free_batch_tok_s']} | 1.0 |",
            f"| half constrained (batch) | {report['mixed_batch_tok_s']} | "
            f"{report['batch_ratio']} |",
            "",
            f"grammar compile: {report['first_compile_ms']} ms first, "
            f"{report['cached_compile_ms']} ms cached; documents ended within max_tokens: "
            f"{report['num_finished']} of {report['num_documents']}, every one valid: "
            f"{'yes' if report['finished_all_valid'] else 'NO'}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.structured_output", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--model", help=f"default: {DEFAULT_CHAT_MODEL}")
    parser.add_argument("--quantization", default="auto", help="default: auto (the GGUF's)")
    parser.add_argument("--repeats", type=int, help=f"default: {REPEATS}")
    parser.add_argument("--batch", type=int, help=f"requests in the batch (default: {BATCH})")
    parser.add_argument("--models-dir", type=Path, default=None, help="default: the data dir's")
    parser.add_argument("--smoke", action="store_true", help=f"{BUNDLED_CHAT_MODEL}, small")
    args = parser.parse_args(argv)

    def run() -> dict:
        return run_benchmark(
            args.model or (BUNDLED_CHAT_MODEL if args.smoke else DEFAULT_CHAT_MODEL),
            models_dir=args.models_dir or default_models_dir(),
            quantization=args.quantization,
            repeats=args.repeats or (SMOKE_REPEATS if args.smoke else REPEATS),
            batch=args.batch or (SMOKE_BATCH if args.smoke else BATCH),
        )

    return run_cli(
        run,
        as_json=args.json,
        format_report=format_table,
        num_errors=lambda report: 0 if report["finished_all_valid"] else 1,
    )


if __name__ == "__main__":
    sys.exit(main())
