"""Chunk-KV reuse: first-time RAG questions' TTFT and answer F1, full prefill against reuse.

The squad-dev passages are ingested by Cachet's own pipeline (bench/squad_retrieval.py) and each
question is searched as a chat turn searches; its prompt is laid out by the chat's builder
(chat.prompt: numbered passages, today's facts, the question) under the short-answer instruction
of bench.answer_quality, so the figures are the end-to-end ones of that benchmark.

One engine, chunk-KV reuse on, two cache salts so that neither mode sees the other's blocks:
- **ingestion**: every retrieved passage computed on its own after the system prompt (what the
  engine does by itself after a passage's first use), timed as `precompute_s`;
- before each question, its passages again (untimed: a passage that left the prefix cache since,
  as a long run's prompts outgrow it, is computed again and counted), so every reuse finds its
  passages as it would with a disk tier holding them;
- then, question by question, **full prefill** (the prompt as today: no `reusable`) and
  **reuse** (the same prompt naming its passages), each a first-time question in its salt, then
  each asked again (**repeat**: the whole prompt in the prefix cache). Paired, so a machine
  that gets busier slows both alike: the TTFT ratio is the median of the per-question ratios.

Reported: TTFT p50/mean per mode, the ratio, F1 / exact match (SQuAD normalisation,
evals/answer_metrics.py) per mode and their difference with its 95% paired-bootstrap interval
(bench/paired_bootstrap.py; each question's F1 too, so that runs can be pooled), the share of
prompt tokens computed (the rest came from the prefix cache or reused passages), and the KV
bytes a passage token takes (memory; the same on disk with the disk tier).

    python -m bench.chunk_reuse                      # the default model, 50 questions
    python -m bench.chunk_reuse --recompute-tokens 32 --json
    python -m bench.chunk_reuse --questions 150 --skip-questions 50   # 150 more questions
    python -m bench.chunk_reuse --squad-dir eval/debian-reference-zh   # the Chinese set
    python -m bench.chunk_reuse --smoke              # the bundled model, 4 questions: a minute
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from bench.answer_quality import (
    MAX_ANSWER_TOKENS,
    end_to_end_built_prompts,
    scratch_site,
    short_answer_builder,
)
from bench.paired_bootstrap import paired_difference_interval
from bench.retrieval import percentiles
from bench.squad_questions import DEFAULT_SQUAD_DIR, SquadDataError, load_passages, load_questions
from evals.answer_metrics import is_chinese, score_answer, score_chinese_answer
from harness import CannotRunError, chat_model_dir, cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL, DEFAULT_CHAT_MODEL
from inference.engine import CHUNK_KV_SELECTIONS, PREFILL_WEIGHTS

logger = logging.getLogger(__name__)

DEFAULT_QUESTIONS = 50
SMOKE_QUESTIONS = 4
DEFAULT_INDEX_PASSAGES = 400
SMOKE_INDEX_PASSAGES = 20
FULL_SALT = "bench-full-prefill"
REUSE_SALT = "bench-chunk-reuse"
MODES = ("full", "reuse")


def standalone_passages(prompt) -> list[tuple[int, ...]]:
    """Each passage `prompt` quotes, as the engine computes it on its own: after the system
    prompt."""
    prefix = prompt.token_ids[: prompt.num_prefix_tokens]
    return [tuple(prefix + prompt.token_ids[start:end]) for start, end in prompt.passage_spans]


def precompute_passages(engine, prompts) -> dict:
    """Every distinct passage computed on its own after the system prompt (as ingestion would)."""
    standalone = dict.fromkeys(
        tokens for prompt in prompts for tokens in standalone_passages(prompt)
    )
    started = time.perf_counter()
    compute_on_their_own(engine, list(standalone))
    seconds = time.perf_counter() - started
    num_passage_tokens = sum(len(t) - prompts[0].num_prefix_tokens for t in standalone)
    return {
        "passages": len(standalone),
        "passage_tokens": num_passage_tokens,
        "precompute_s": rounded(seconds, 1),
        "precompute_tokens_per_s": rounded(num_passage_tokens / seconds, 1),
    }


def compute_on_their_own(engine, passages: Sequence[Sequence[int]]) -> int:
    """Runs each of `passages` (from `standalone_passages`) in the reuse salt, as the engine
    keeps them for blends; returns how many were not in the prefix cache whole."""
    from inference.engine import SamplingParams

    results = engine.generate(
        [list(tokens) for tokens in passages],
        SamplingParams(temperature=0, max_tokens=1),
        cache_salt=REUSE_SALT,
    )
    block_size = engine.config.block_size
    return sum(
        result.usage.cached_tokens < (len(tokens) - 1) // block_size * block_size
        for tokens, result in zip(passages, results, strict=True)
    )


def ask(engine, prompt, salt: str, *, reuse: bool, max_tokens: int):
    from inference.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    reusable = [prompt.reusable] if reuse else None
    return engine.generate([prompt.token_ids], params, cache_salt=salt, reusable=reusable)[0]


def answer_f1(answer: str, references: Sequence[str]) -> tuple[float, float]:
    """Token F1 and exact match; Chinese references are scored character by character
    (evals.answer_metrics.score_chinese_answer), as bench.answer_language scores them."""
    score = score_answer(answer, references)
    if any(is_chinese(reference) for reference in references):
        return score_chinese_answer(answer, references).f1, score.exact_match
    return score.f1, score.exact_match


def measure(engine, questions, prompts) -> dict:
    """Each question first-time and repeated, in both modes, paired."""
    rows: dict[str, list[dict]] = {mode: [] for mode in MODES}
    evicted_passages = 0
    for question, prompt in zip(questions, prompts, strict=True):
        # NOTE: passages precomputed long before may have left the prefix cache since (a run's
        # prompts in two salts outgrow it); computed again here, untimed, each question's
        # reuse measures blends that find their passages, as with a disk tier holding them
        evicted_passages += compute_on_their_own(engine, standalone_passages(prompt))
        for mode, salt in (("full", FULL_SALT), ("reuse", REUSE_SALT)):
            first = ask(engine, prompt, salt, reuse=mode == "reuse", max_tokens=MAX_ANSWER_TOKENS)
            repeat = ask(engine, prompt, salt, reuse=mode == "reuse", max_tokens=1)
            usage = first.usage
            f1, exact_match = answer_f1(first.text, question.answers)
            rows[mode].append({
                "ttft_s": usage.ttft_s,
                "repeat_ttft_s": repeat.usage.ttft_s,
                "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": usage.cached_tokens,
                "reused_tokens": usage.reused_tokens,
                "f1": f1,
                "exact_match": exact_match,
                "answer": first.text.strip(),
            })  # fmt: skip
    report: dict = {"evicted_passages_computed_again": evicted_passages}
    for mode, mode_rows in rows.items():
        computed = [r["prompt_tokens"] - r["cached_tokens"] - r["reused_tokens"] for r in mode_rows]
        report[mode] = {
            "ttft_s": percentiles([r["ttft_s"] for r in mode_rows]),
            "repeat_ttft_s": percentiles([r["repeat_ttft_s"] for r in mode_rows]),
            "f1": rounded(statistics.fmean(r["f1"] for r in mode_rows)),
            "exact_match": rounded(statistics.fmean(r["exact_match"] for r in mode_rows)),
            "mean_prompt_tokens": rounded(statistics.fmean(r["prompt_tokens"] for r in mode_rows)),
            "mean_computed_tokens": rounded(statistics.fmean(computed), 1),
            "mean_reused_tokens": rounded(statistics.fmean(r["reused_tokens"] for r in mode_rows)),
            "answers": [r["answer"] for r in mode_rows],
            "f1_per_question": [rounded(r["f1"]) for r in mode_rows],  # to pool runs
            "reused_tokens_per_question": [r["reused_tokens"] for r in mode_rows],
        }
    ratios = [
        full["ttft_s"] / reuse["ttft_s"]
        for full, reuse in zip(rows["full"], rows["reuse"], strict=True)
        if reuse["ttft_s"]
    ]
    report["ttft_ratio_full_over_reuse"] = rounded(statistics.median(ratios), 2)
    report["f1_difference"] = rounded(report["reuse"]["f1"] - report["full"]["f1"])
    report["f1_difference_ci95"] = [
        rounded(bound)
        for bound in paired_difference_interval(
            [r["f1"] for r in rows["full"]], [r["f1"] for r in rows["reuse"]]
        )
    ]
    report["computed_share"] = {
        mode: rounded(report[mode]["mean_computed_tokens"] / report[mode]["mean_prompt_tokens"])
        for mode in MODES
    }
    return report


def load_eval_set(directory: Path, limit: int, skip: int = 0) -> tuple[list, list]:
    """`limit` questions (with answers) after the first `skip`, and the corpus: squad-dev, or a
    BEIR-layout set whose answers.jsonl covers only some questions (the Chinese set: its
    answered ones)."""
    from bench.answer_language import load_corpus, load_set

    try:
        return load_questions(directory, skip + limit)[skip:], load_passages(directory)
    except SquadDataError:
        return load_set(directory, skip + limit)[skip:], load_corpus(directory)


def run_benchmark(
    *,
    model: str,
    num_questions: int,
    index_passages: int,
    skip_questions: int = 0,
    top_k: int | None,
    recompute_tokens: int,
    squad_dir: Path,
    models_dir: Path,
    kv_cache_mb: int,
    prefill_weights: str | None = None,
    selection: str | None = None,
) -> dict:
    from bench.squad_retrieval import passages_to_index, retrieve
    from inference.engine import Engine, EngineConfig

    try:
        questions, corpus = load_eval_set(squad_dir, num_questions, skip_questions)
        if not questions:
            raise SquadDataError(f"{squad_dir} has no questions after the first {skip_questions}")
    except SquadDataError as error:
        raise CannotRunError(str(error)) from None
    model_dir = chat_model_dir(model, models_dir)
    retrieved = retrieve(
        questions, passages_to_index(questions, corpus, index_passages), top_k=top_k
    )
    config = EngineConfig(
        model_dir=model_dir,
        max_model_len=4096,
        kv_cache_mb=kv_cache_mb,
        max_num_batched_tokens=2048,
        chunk_kv_reuse=True,
        chunk_kv_recompute_tokens=recompute_tokens,
        **({} if prefill_weights is None else {"prefill_weights": prefill_weights}),
        **({} if selection is None else {"chunk_kv_selection": selection}),
    )
    with Engine(config) as engine:
        if engine.core.scheduler.chunk_reuse_recompute_tokens is None:
            raise CannotRunError(f"chunk-KV reuse cannot run with {model} here (see the log)")
        builder = short_answer_builder(engine)
        prompts = end_to_end_built_prompts(builder, questions, retrieved.hits, model)
        ingestion = precompute_passages(engine, prompts)
        report = measure(engine, questions, prompts)
        bytes_per_token = engine.runner.kv_cache.bytes_per_token
        prefill_weights = engine.runner.prefill_weights  # what "auto" (the default) chose
        by_deviation = engine.core.scheduler.chunk_reuse_by_deviation
    return {
        "config": {
            "model": model,
            "questions": len(questions),
            "skipped_questions": skip_questions,
            "top_k": retrieved.top_k,
            "gold_retrieved": rounded(retrieved.gold_recall),
            "recompute_tokens": recompute_tokens,
            "selection": "deviation" if by_deviation else "leading",
            "prefill_weights": prefill_weights,
            "max_answer_tokens": MAX_ANSWER_TOKENS,
            "kv_bytes_per_token": bytes_per_token,
            "cpu": cpu_name(),
        },
        "ingestion": ingestion,
        **report,
    }


def format_table(report: dict) -> str:
    config = report["config"]
    lines = [
        f"Chunk-KV reuse, {config['model']}: {config['questions']} squad-dev questions, top "
        f"{config['top_k']} passages (gold retrieved {config['gold_retrieved']:.0%}), "
        f"{config['recompute_tokens']} tokens recomputed per passage ({config['cpu']}).",
        "",
        "| mode | TTFT p50 / mean s | repeat TTFT p50 s | computed share | F1 | exact match |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        row = report[mode]
        lines.append(
            f"| {mode} | {row['ttft_s']['p50']:.2f} / {row['ttft_s']['mean']:.2f} | "
            f"{row['repeat_ttft_s']['p50']:.2f} | {report['computed_share'][mode]:.0%} | "
            f"{row['f1']:.3f} | {row['exact_match']:.3f} |"
        )
    ingestion = report["ingestion"]
    lines += [
        "",
        f"TTFT full / reuse (median of paired ratios): {report['ttft_ratio_full_over_reuse']}x; "
        f"F1 difference {report['f1_difference']:+.3f} (95% interval "
        f"{report['f1_difference_ci95'][0]:+.3f} to {report['f1_difference_ci95'][1]:+.3f}, "
        f"paired bootstrap). Ingestion: {ingestion['passages']} "
        f"passages ({ingestion['passage_tokens']} tokens) computed in "
        f"{ingestion['precompute_s']} s; {config['kv_bytes_per_token']} KV bytes a token.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chunk_reuse", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--model", default=None, help=f"default: {DEFAULT_CHAT_MODEL}")
    parser.add_argument("--questions", type=int, default=DEFAULT_QUESTIONS)
    parser.add_argument(
        "--skip-questions",
        type=int,
        default=0,
        help="start after this many questions (to extend an earlier run with new ones)",
    )
    parser.add_argument("--index-passages", type=int, default=DEFAULT_INDEX_PASSAGES)
    parser.add_argument("--top-k", type=int, help="passages per question (default: the site's)")
    parser.add_argument("--recompute-tokens", type=int, default=16)
    parser.add_argument("--squad-dir", type=Path, default=DEFAULT_SQUAD_DIR)
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--kv-cache-mb", type=int, default=3072)
    parser.add_argument(
        "--prefill-weights",
        choices=PREFILL_WEIGHTS,
        default=None,
        help="the engine's prefill_weights (default: the engine's)",
    )
    parser.add_argument(
        "--selection",
        choices=CHUNK_KV_SELECTIONS,
        default=None,
        help="which tokens of a reused passage are recomputed (default: the engine's)",
    )
    parser.add_argument("--smoke", action="store_true", help="bundled model, 4 questions")
    args = parser.parse_args(argv)
    if args.smoke:
        args.questions, args.index_passages = SMOKE_QUESTIONS, SMOKE_INDEX_PASSAGES
        args.model = args.model or BUNDLED_CHAT_MODEL
        args.kv_cache_mb = min(args.kv_cache_mb, 512)
    if (
        args.questions < 1
        or min(args.index_passages, args.recompute_tokens, args.skip_questions) < 0
    ):
        parser.error(
            "--questions >= 1, --index-passages, --recompute-tokens, --skip-questions >= 0"
        )
    models_dir = args.models_dir or default_models_dir()  # before the scratch site moves it

    def run() -> dict:
        with scratch_site():
            return run_benchmark(
                model=args.model or DEFAULT_CHAT_MODEL,
                num_questions=args.questions,
                index_passages=args.index_passages,
                skip_questions=args.skip_questions,
                top_k=args.top_k,
                recompute_tokens=args.recompute_tokens,
                squad_dir=args.squad_dir,
                models_dir=models_dir,
                kv_cache_mb=args.kv_cache_mb,
                prefill_weights=args.prefill_weights,
                selection=args.selection,
            )

    return run_cli(run, as_json=args.json, format_report=format_table, num_errors=lambda _: 0)


if __name__ == "__main__":
    raise SystemExit(main())
