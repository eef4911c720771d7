"""Speculative decoding, single stream: speed and acceptance per method on three kinds of answer.

The target (default: qwen2.5-coder-1.5b-instruct) answers three prompts greedily, one request at
a time: code generation, an extractive RAG answer (a passage and a question about it) and free
text. Methods: no speculation, n-gram prompt lookup, and a draft model (default:
qwen2.5-coder-0.5b-instruct) proposing k = 3, 4 and 5 tokens. Reported per method and prompt:
decode tok/s (after the first token, on a warm prefix cache), the speed-up over no speculation,
the share of drafts accepted, and whether the answer is the one plain decoding gave. (It is,
token for token, in float32; in bf16 too as long as contexts are short: beyond 8 KV blocks the
decode attention kernel splits a context into partitions chosen by the batch's size, and a
verification batches the drafts' positions, so a near-tie may round the other way, as it may
when plain decoding shares its batch with other requests.)

Every method runs in a fresh process: each engine thread gets its own OpenMP team, and a second
engine thread in one process slows every parallel region after it (see the NOTE in engine.py's
`_thread_main`). The weights load again each time from the models cache.

    python -m bench.speculative                  # the table (~15 minutes on 2 cores)
    python -m bench.speculative --json
    python -m bench.speculative --smoke          # SmolLM2 drafting for itself, k=4, 16 tokens
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.fresh_process import child_arguments, report_to_parent, run_in_fresh_process
from harness import cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL

logger = logging.getLogger(__name__)

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DRAFT_TOKENS = (3, 4, 5)
NGRAM_TOKENS = 5  # the app's default (inference/models.py)
MAX_TOKENS = 128
SMOKE_MAX_TOKENS = 16

PASSAGE = (
    "Travel policy, section 4. Employees book flights through the travel desk at least 14 days "
    "before departure; later bookings need a manager's approval in writing. Economy class is "
    "the rule for flights under six hours, premium economy above that. Hotel stays are "
    "reimbursed up to 180 euros a night in capitals and 120 euros elsewhere, breakfast "
    "included. Taxis are reimbursed only when no train or bus reaches the destination within "
    "45 minutes. Receipts must be uploaded within 30 days of the trip's end."
)
PROMPTS = {
    "code": "Write a Python function merge_intervals(intervals) that merges overlapping "
    "intervals given as (start, end) tuples, with type hints, a docstring and a short example.",
    "extractive": f"{PASSAGE}\n\nAccording to the policy above, when are taxis reimbursed, how "
    "far ahead must flights be booked, and what are the hotel limits? Quote the policy's own "
    "sentences.",
    "free_text": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


@dataclass(frozen=True, slots=True)
class Method:
    name: str  # "none", "ngram" or "draft"
    num_speculative_tokens: int = 0

    @property
    def label(self) -> str:
        return self.name if self.name == "none" else f"{self.name} k={self.num_speculative_tokens}"


def methods(*, smoke: bool = False, draft_tokens: Sequence[int] = ()) -> list[Method]:
    """What is measured: the draft sizes given, else all of DRAFT_TOKENS (with `smoke`, one
    draft size: each method loads the models again)."""
    draft_tokens = draft_tokens or (DRAFT_TOKENS[1:2] if smoke else DRAFT_TOKENS)
    return [
        Method("none"),
        Method("ngram", NGRAM_TOKENS),
        *(Method("draft", k) for k in draft_tokens),
    ]


def measure_method(
    method: Method,
    target_dir: Path,
    draft_dir: Path | None,
    *,
    max_tokens: int,
    engine_options: dict,
) -> dict:
    """One engine with `method`: each prompt answered once to warm up, then measured.
    `engine_options`: EngineConfig's quantization, draft_quantization and num_threads."""
    from inference.engine import Engine, EngineConfig, SamplingParams

    settings: dict = {"max_model_len": 2048, "kv_cache_mb": 256} | engine_options
    if method.name != "draft":
        settings.pop("draft_quantization", None)
    if method.name != "none":
        settings["num_speculative_tokens"] = method.num_speculative_tokens
    if method.name == "draft":
        settings |= {"speculative_method": "draft", "draft_model_dir": draft_dir}
    engine = Engine(EngineConfig(target_dir, **settings))
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        results = {}
        for name, question in PROMPTS.items():
            prompt = engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True
            )
            prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
            engine.generate([prompt], params)  # warm: prefix caches, first calls
            before = engine.metrics.snapshot()
            [result] = engine.generate([prompt], params)
            after = engine.metrics.snapshot()
            num_drafted = after["spec_draft_tokens"] - before["spec_draft_tokens"]
            num_accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
            results[name] = {
                "prompt_tokens": len(prompt),
                "completion_tokens": result.usage.completion_tokens,
                "tok_s": rounded(result.usage.tokens_per_s, 2),
                "acceptance": rounded(num_accepted / num_drafted, 3) if num_drafted else None,
                "token_ids": result.token_ids,
            }
    finally:
        engine.shutdown()
    return {"method": asdict(method), "label": method.label, "prompts": results}


def run_benchmark(
    target: str,
    draft: str,
    *,
    quantization: str,
    max_tokens: int,
    models_dir: Path,
    draft_quantization: str | None = None,
    draft_tokens: Sequence[int] = (),
    num_threads: int = 0,
    smoke: bool = False,
) -> dict:
    from inference.model_files import resolve_chat_model

    target_dir = resolve_chat_model(target, models_dir).directory
    draft_dir = resolve_chat_model(draft, models_dir).directory
    engine_options = {
        "quantization": quantization,
        "draft_quantization": draft_quantization,
        "num_threads": num_threads,
    }
    rows = []
    for method in methods(smoke=smoke, draft_tokens=draft_tokens):
        logger.info("measuring %s", method.label)
        rows.append(_in_fresh_process(method, target_dir, draft_dir, max_tokens, engine_options))
    plain = rows[0]["prompts"]
    plain_token_ids = {name: result["token_ids"] for name, result in plain.items()}
    plain_tok_s = {name: result["tok_s"] for name, result in plain.items()}
    for row in rows:
        for name, result in row["prompts"].items():
            result["speedup"] = rounded(result["tok_s"] / plain_tok_s[name], 2)
            result["same_answer"] = result.pop("token_ids") == plain_token_ids[name]
    return {
        "cpu": cpu_name(),
        "target": target,
        "draft": draft,
        "quantization": quantization,
        "draft_quantization": draft_quantization or quantization,
        "max_tokens": max_tokens,
        "torch_threads": num_threads or torch_threads(),
        "rows": rows,
    }


def _in_fresh_process(
    method: Method,
    target_dir: Path,
    draft_dir: Path,
    max_tokens: int,
    engine_options: dict,
) -> dict:
    arguments = {
        "method": asdict(method),
        "target_dir": str(target_dir),
        "draft_dir": str(draft_dir),
        "max_tokens": max_tokens,
        "engine_options": engine_options,
    }
    return run_in_fresh_process("bench.speculative", arguments, label=method.label)


def _child(arguments_file: str) -> int:
    options = child_arguments(arguments_file)
    result = measure_method(
        Method(**options["method"]),
        Path(options["target_dir"]),
        Path(options["draft_dir"]),
        max_tokens=options["max_tokens"],
        engine_options=options["engine_options"],
    )
    report_to_parent(result)
    return 0


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def format_table(report: dict) -> str:
    lines = [
        f"{report['target']} ({report['quantization']}), draft {report['draft']} "
        f"({report['draft_quantization']}), "
        f"{report['max_tokens']} greedy tokens, single stream, {report['cpu']}, "
        f"{report['torch_threads']} torch threads",
        "",
        "| method | prompt | tok/s | speed-up | acceptance | same answer |",
        "|---|---|---:|---:|---:|---|",
    ]
    for row in report["rows"]:
        for name, result in row["prompts"].items():
            acceptance = result["acceptance"]
            lines.append(
                f"| {row['label']} | {name} | {result['tok_s']} | {result['speedup']}x | "
                f"{'-' if acceptance is None else f'{acceptance:.0%}'} | "
                f"{'yes' if result['same_answer'] else 'no'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.speculative", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--target", help=f"the model (default: {DEFAULT_TARGET})")
    parser.add_argument("--draft", help=f"the draft model (default: {DEFAULT_DRAFT})")
    parser.add_argument("--quantization", default="int4", help="of the target (default: int4)")
    parser.add_argument(
        "--draft-quantization", help="of the draft model (default: as --quantization)"
    )
    parser.add_argument("--max-tokens", type=int, help=f"per answer (default: {MAX_TOKENS})")
    parser.add_argument("--models-dir", type=Path, default=None, help="default: the data dir's")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core)")
    parser.add_argument(
        "--draft-tokens",
        type=int,
        action="append",
        help=f"k, drafts per step; repeat (default: {', '.join(map(str, DRAFT_TOKENS))})",
    )
    parser.add_argument(
        "--smoke", action="store_true", help=f"{BUNDLED_CHAT_MODEL} drafting for itself"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one method, in a fresh process
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child)
    default_model = BUNDLED_CHAT_MODEL if args.smoke else None
    max_tokens = args.max_tokens or (SMOKE_MAX_TOKENS if args.smoke else MAX_TOKENS)
    if max_tokens < 2:
        parser.error("--max-tokens must be at least 2 (tok/s is measured after the first)")

    def run() -> dict:
        return run_benchmark(
            args.target or default_model or DEFAULT_TARGET,
            args.draft or default_model or DEFAULT_DRAFT,
            quantization=args.quantization,
            max_tokens=max_tokens,
            models_dir=args.models_dir or default_models_dir(),
            draft_quantization=args.draft_quantization,
            draft_tokens=args.draft_tokens or (),
            num_threads=args.threads,
            smoke=args.smoke,
        )

    return run_cli(run, as_json=args.json, format_report=format_table, num_errors=lambda r: 0)


if __name__ == "__main__":
    sys.exit(main())
