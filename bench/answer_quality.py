"""Answer quality on squad-dev: token F1, exact match and "answer contained", per model and format.

Two measurements, each on the same fixed questions (the first `--questions` of squad-dev, see
bench/squad_questions.py), every question greedy with at most 32 new tokens, all of a run's
questions submitted to the engine at once (continuous batching):

- **gold passage** (reading comprehension, the model's own skill): the question's gold passage
  and a short-answer instruction, laid out by the product's token-level prompt builder
  (inference.prompts) through the model's chat template;
- **end to end** (what a user gets): the squad-dev passages ingested into a throwaway collection
  by Cachet's own pipeline, each question searched as a chat turn searches (hybrid BM25 + dense,
  reranked, top-K) and its prompt laid out by the chat's own builder (chat.prompt: numbered
  passages, today's facts, the question) under the same short-answer instruction. The share of
  questions whose gold passage was retrieved is reported beside it.

Scores follow the official SQuAD normalisation (evals/answer_metrics.py). Models are named as
`resolve_chat_model` takes them (a catalogue name, a .gguf, a directory, a hub id; none: the
catalogue's default model, with `--smoke` the bundled one); `--model` and `--quantization`
repeat, every model is measured in every format, one engine at a time.

    python -m bench.answer_quality                       # the default model, bf16, 100 questions
    python -m bench.answer_quality --model /tmp/models/qwen15.gguf --quantization int4 --json
    python -m bench.answer_quality --smoke               # 5 questions, small index: < 1 minute
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.squad_questions import (
    DEFAULT_SQUAD_DIR,
    SquadDataError,
    SquadQuestion,
    load_passages,
    load_questions,
)
from evals.answer_metrics import score_answer
from harness import CannotRunError, cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL, DEFAULT_CHAT_MODEL
from inference.prompts import BuiltPrompt, PromptBuilder

logger = logging.getLogger(__name__)

MODES = ("gold", "e2e")
MODE_NAMES = {"gold": "gold passage", "e2e": "end to end"}
MAX_ANSWER_TOKENS = 32
DEFAULT_QUESTIONS = 100
SMOKE_QUESTIONS = 5
SMOKE_INDEX_PASSAGES = 20  # distractors beside the smoke questions' gold passages
# NOTE: one instruction for both modes, so their difference is retrieval and layout alone.
SHORT_ANSWER_PROMPT = (
    "Answer the question from the text you are given. Reply with the answer only: a few words "
    "copied from the text, not a sentence."
)
# NOTE: the end-to-end user turn states today's date and the user's name (chat.prompt); fixed,
# so every run lays out the same prompts.
E2E_TODAY = datetime.date(2025, 1, 6)
E2E_USER_NAME = "Sam"


def gold_passage_text(question: SquadQuestion) -> str:
    """The reading-comprehension user turn: the passage, then the question."""
    passage = question.passage
    return f"{passage.title}\n\n{passage.text}\n\nQuestion: {question.question}"


def build_engine(model_dir: Path, quantization: str, *, dtype: str, kv_cache_mb: int):
    from inference.engine import Engine, EngineConfig

    config = EngineConfig(
        model_dir=model_dir,
        dtype=dtype,
        quantization=quantization,
        max_model_len=4096,
        kv_cache_mb=kv_cache_mb,
        max_num_seqs=16,
        max_num_batched_tokens=512,
    )
    return Engine(config)


def short_answer_builder(engine) -> PromptBuilder:
    """The product's prompt builder for `engine`'s model, under the short-answer instruction."""
    return PromptBuilder(
        engine.tokenizer,
        SHORT_ANSWER_PROMPT,
        max_model_len=engine.max_model_len,
        tokenizer_lock=engine.tokenizer_lock,
    )


def gold_passage_prompts(
    builder: PromptBuilder, questions: Sequence[SquadQuestion]
) -> list[list[int]]:
    return [
        builder.build([], gold_passage_text(q), max_tokens=MAX_ANSWER_TOKENS).token_ids
        for q in questions
    ]


def end_to_end_prompts(
    builder: PromptBuilder,
    questions: Sequence[SquadQuestion],
    hits: Sequence[Sequence],
    model_name: str,
) -> list[list[int]]:
    """Each question with its retrieved passages, laid out by the chat turn's own builder."""
    built = end_to_end_built_prompts(builder, questions, hits, model_name)
    return [prompt.token_ids for prompt in built]


def end_to_end_built_prompts(
    builder: PromptBuilder,
    questions: Sequence[SquadQuestion],
    hits: Sequence[Sequence],
    model_name: str,
) -> list[BuiltPrompt]:
    """`end_to_end_prompts` with where each prompt's passages are (for chunk-KV reuse)."""
    from chat.prompt import build_with_passages

    prompts = []
    for question, found in zip(questions, hits, strict=True):
        prompt, _ = build_with_passages(
            builder,
            question.question,
            list(found),
            [],
            model_name=model_name,
            user_name=E2E_USER_NAME,
            today=E2E_TODAY,
            max_tokens=MAX_ANSWER_TOKENS,
        )
        prompts.append(prompt)
    return prompts


def answer_all(engine, questions: Sequence[SquadQuestion], prompts: list[list[int]]) -> dict:
    """Generate every answer in one batch and score it; the mode's figures and its answers."""
    from inference.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_ANSWER_TOKENS)
    started = time.perf_counter()
    results = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    answers, scores = [], []
    for question, result in zip(questions, results, strict=True):
        score = score_answer(result.text, question.answers)
        scores.append(score)
        answers.append({
            "question_id": question.question_id,
            "answer": result.text.strip(),
            "references": list(question.answers),
            "f1": rounded(score.f1, 3),
            "exact_match": score.exact_match,
            "contained": score.contained,
            "answer_tokens": result.usage.completion_tokens,
        })  # fmt: skip
    num_tokens = sum(a["answer_tokens"] for a in answers)
    return {
        "num_questions": len(answers),
        "f1": rounded(statistics.fmean(score.f1 for score in scores)),
        "exact_match": rounded(statistics.fmean(score.exact_match for score in scores)),
        "contained": rounded(statistics.fmean(score.contained for score in scores)),
        "mean_answer_tokens": rounded(num_tokens / len(answers), 1),
        "mean_prompt_tokens": rounded(statistics.fmean(map(len, prompts)), 1),
        "seconds": rounded(seconds, 1),
        "tok_s": rounded(num_tokens / seconds, 1),
        "answers": answers,
    }


def measure_format(
    model_dir: Path,
    model_name: str,
    quantization: str,
    questions: Sequence[SquadQuestion],
    retrieved,  # bench.squad_retrieval.Retrieved, or None without the end-to-end mode
    *,
    modes: Sequence[str],
    dtype: str,
    kv_cache_mb: int,
) -> list[dict]:
    """Both modes on one engine (model + quantization); the engine is gone when this returns."""
    from inference.engine import model_weight_bytes

    started = time.perf_counter()
    engine = build_engine(model_dir, quantization, dtype=dtype, kv_cache_mb=kv_cache_mb)
    load_s = time.perf_counter() - started
    try:
        common = {
            "model": model_name,
            "quantization": quantization,
            "dtype": str(engine.config.dtype).removeprefix("torch."),
            "weights_mb": rounded(model_weight_bytes(engine.runner.model) / 2**20, 1),
            "load_s": rounded(load_s, 1),
        }
        rows = []
        if "gold" in modes:
            logger.info(
                "%s %s: gold passage, %d questions", model_name, quantization, len(questions)
            )
            prompts = gold_passage_prompts(short_answer_builder(engine), questions)
            rows.append(common | {"mode": "gold"} | answer_all(engine, questions, prompts))
        if "e2e" in modes:
            logger.info("%s %s: end to end", model_name, quantization)
            builder = short_answer_builder(engine)
            prompts = end_to_end_prompts(builder, questions, retrieved.hits, model_name)
            row = common | {"mode": "e2e"} | answer_all(engine, questions, prompts)
            row["gold_retrieved"] = rounded(retrieved.gold_recall)
            rows.append(row)
    finally:
        engine.shutdown()
        # NOTE: one model in memory at a time: the next engine loads only after this one's
        # weights are freed.
        del engine
        gc.collect()
    return rows


def gold_passage_f1(
    model_dir: Path,
    questions: Sequence[SquadQuestion],
    *,
    quantization: str = "none",
    kv_cache_dtype: str = "auto",
    dtype: str = "bfloat16",
) -> float:
    """Mean gold-passage token F1 of one weight and KV format (the optimization table's column)."""
    from inference.engine import Engine, EngineConfig

    config = EngineConfig(
        model_dir=model_dir,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=4096,
        kv_cache_mb=256,
        max_num_seqs=16,
    )
    with Engine(config) as engine:
        prompts = gold_passage_prompts(short_answer_builder(engine), questions)
        result = answer_all(engine, questions, prompts)
    return float(result["f1"])


def run_benchmark(
    *,
    models: Sequence[str],
    quantizations: Sequence[str],
    modes: Sequence[str],
    num_questions: int,
    squad_dir: Path,
    models_dir: Path,
    index_passages: int | None,
    top_k: int | None,
    dtype: str,
    kv_cache_mb: int,
) -> dict:
    """Every model in every format, both modes; end to end needs Django set up (see `main`)."""
    from inference.model_files import ModelSourceError, resolve_chat_model

    try:
        questions = load_questions(squad_dir, num_questions)
        corpus = load_passages(squad_dir) if "e2e" in modes else []
    except SquadDataError as error:
        raise CannotRunError(str(error)) from None
    retrieved = None
    config: dict = {
        "questions": len(questions),
        "selection": f"the first {len(questions)} questions of {squad_dir}/queries.jsonl",
        "max_answer_tokens": MAX_ANSWER_TOKENS,
        "system_prompt": SHORT_ANSWER_PROMPT,
        "torch_threads": _torch_threads(),
        "cpu": cpu_name(),
    }
    if "e2e" in modes:
        from bench.squad_retrieval import passages_to_index, retrieve

        passages = passages_to_index(questions, corpus, index_passages)
        retrieved = retrieve(questions, passages, top_k=top_k)
        config["retrieval"] = {
            "passages": retrieved.num_passages,
            "chunks": retrieved.num_chunks,
            "top_k": retrieved.top_k,
            "index_s": rounded(retrieved.index_s, 1),
            "search_s": rounded(retrieved.search_s, 1),
            "gold_retrieved": rounded(retrieved.gold_recall),
        }
    results = []
    for source in models:
        try:
            resolved = resolve_chat_model(source, models_dir)
        except ModelSourceError as error:
            raise CannotRunError(f"model {source}: {error}") from None
        name = Path(source).name if Path(source).exists() else source
        for quantization in quantizations:
            try:
                results += measure_format(
                    resolved.directory, name, quantization, questions,
                    retrieved, modes=modes, dtype=dtype, kv_cache_mb=kv_cache_mb,
                )  # fmt: skip
            except ValueError as error:  # ConfigError: an unknown quantization or dtype
                raise CannotRunError(f"{name} {quantization}: {error}") from None
    return {"config": config, "results": results}


def format_table(report: dict) -> str:
    """The report as a markdown table, one row per model, format and mode."""
    config = report["config"]
    lines = [
        f"Answer quality on squad-dev: {config['questions']} questions, greedy, at most "
        f"{config['max_answer_tokens']} answer tokens, {config['torch_threads']} torch threads "
        f"({config['cpu']}).",
    ]
    if "retrieval" in config:
        retrieval = config["retrieval"]
        lines.append(
            f"End to end: {retrieval['passages']} passages ({retrieval['chunks']} chunks), "
            f"hybrid + rerank top {retrieval['top_k']}; gold passage retrieved for "
            f"{retrieval['gold_retrieved']:.0%} of the questions."
        )
    lines += [
        "",
        "| model | weights | mode | F1 | exact match | contained | answer tokens | seconds |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        lines.append(
            f"| {row['model']} | {_format_name(row)} | {MODE_NAMES[row['mode']]} | "
            f"{row['f1']:.3f} | {row['exact_match']:.3f} | {row['contained']:.0%} | "
            f"{row['mean_answer_tokens']:.1f} | {row['seconds']:.1f} |"
        )
    return "\n".join(lines)


def _format_name(row: dict) -> str:
    return row["dtype"] if row["quantization"] == "none" else row["quantization"]


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


@contextlib.contextmanager
def scratch_site() -> Iterator[None]:
    """Django on a throwaway data dir and SQLite file (unless a site is already set up: the
    tests), so the end-to-end index never touches real data."""
    from django.conf import settings

    if settings.configured:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="cachet-answer-quality-site-") as scratch:
        os.environ["CACHET_DATA_DIR"] = scratch
        os.environ["DATABASE_URL"] = f"sqlite:///{scratch}/bench.sqlite3"
        os.environ.setdefault("CACHET_SECRET_KEY", "answer-quality-bench-throwaway-" + "x" * 32)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        yield


def add_run_arguments(parser: argparse.ArgumentParser, *, questions: int, smoke: int) -> None:
    """The options of both answer benchmarks (this one and bench.answer_language)."""
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--mode", action="append", choices=MODES, help="repeat (default: both)")
    parser.add_argument("--questions", type=int, default=questions)
    parser.add_argument(
        "--index-passages",
        type=int,
        help="end to end: index the first N corpus passages and the gold ones (default: all)",
    )
    parser.add_argument("--top-k", type=int, help="passages per question (default: the site's)")
    parser.add_argument("--models-dir", type=Path, default=None, help="default: the data dir's")
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--smoke", action="store_true", help=f"{smoke} questions, a small index")


def parse_run_arguments(
    parser: argparse.ArgumentParser, argv: list[str] | None, *, smoke: int
) -> tuple[argparse.Namespace, tuple[str, ...], Path]:
    """The arguments (`--smoke` applied, checked), the modes to run, the models directory."""
    args = parser.parse_args(argv)
    if args.smoke:
        args.questions = smoke
        args.index_passages = (
            SMOKE_INDEX_PASSAGES if args.index_passages is None else args.index_passages
        )
    if args.questions < 1 or (args.index_passages is not None and args.index_passages < 0):
        parser.error("--questions must be at least 1, --index-passages at least 0")
    modes = tuple(dict.fromkeys(args.mode or MODES))
    models_dir = args.models_dir or default_models_dir()  # before a scratch site moves the data dir
    return args, modes, models_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.answer_quality", description=__doc__.splitlines()[0]
    )
    add_run_arguments(parser, questions=DEFAULT_QUESTIONS, smoke=SMOKE_QUESTIONS)
    parser.add_argument(
        "--model",
        action="append",
        help="a catalogue name, .gguf, directory or hub id; repeat (default: the catalogue's "
        "default model; with --smoke its bundled one)",
    )
    parser.add_argument(
        "--quantization", action="append", help="none, int8, int4...; repeat (default: none)"
    )
    parser.add_argument("--squad-dir", type=Path, default=DEFAULT_SQUAD_DIR)
    parser.add_argument("--dtype", default="auto", help="engine dtype (auto: bf16 where native)")
    args, modes, models_dir = parse_run_arguments(parser, argv, smoke=SMOKE_QUESTIONS)

    def run() -> dict:
        with scratch_site() if "e2e" in modes else contextlib.nullcontext():
            return run_benchmark(
                models=args.model or [BUNDLED_CHAT_MODEL if args.smoke else DEFAULT_CHAT_MODEL],
                quantizations=args.quantization or ["none"],
                modes=modes,
                num_questions=args.questions,
                squad_dir=args.squad_dir,
                models_dir=models_dir,
                index_passages=args.index_passages,
                top_k=args.top_k,
                dtype=args.dtype,
                kv_cache_mb=args.kv_cache_mb,
            )

    return run_cli(run, as_json=args.json, format_report=format_table, num_errors=lambda r: 0)


if __name__ == "__main__":
    sys.exit(main())
