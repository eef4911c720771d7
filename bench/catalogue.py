"""The model catalogue's table: what each model costs to load and to serve, and how well it answers.

Every catalogue model (or those named with `--model`), served as Cachet serves it by default
(quantization "auto": a GGUF's tensors kept in their own precision), in one run:

- **load**: seconds to build the engine, the weights' MiB against the checkpoint's tensor MiB,
  and the load's peak resident memory (the engine's LoadReport);
- **speed** (bench.workload's prompts: a ~1,000-token system prompt, a new ~250-token user turn
  per request, 64 greedy tokens): single-stream decode tok/s and throughput at 16 concurrent;
- **answers** (bench.answer_quality, squad-dev): token F1 with the gold passage in the prompt
  (reading comprehension) and end to end through Cachet's retrieval. A base model (no chat
  template) gets no F1: it continues text, it does not answer.

Each model runs in a fresh process (see bench.speculative: a second engine thread in one process
slows every parallel region after it); retrieval runs once, in this process, and each child gets
its end-to-end prompts laid out with its own tokenizer.

    python -m bench.catalogue                       # the table for the whole catalogue
    python -m bench.catalogue --model qwen2.5-coder-0.5b-instruct --json
    python -m bench.catalogue --smoke               # the bundled model, tiny sizes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench.answer_quality import (
    SHORT_ANSWER_PROMPT,
    SMOKE_INDEX_PASSAGES,
    answer_all,
    build_engine,
    end_to_end_prompts,
    gold_passage_prompts,
    scratch_site,
    short_answer_builder,
)
from bench.engine import measure_speed
from bench.fresh_process import child_arguments, report_to_parent, run_in_fresh_process
from bench.squad_questions import DEFAULT_SQUAD_DIR, SquadDataError, load_passages, load_questions
from bench.workload import Seeds, Workload
from harness import CannotRunError, cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL, CATALOGUE

logger = logging.getLogger(__name__)

CONCURRENCY = 16
WORKLOAD = Workload(concurrency=(CONCURRENCY,))
SMOKE_WORKLOAD = Workload(system_tokens=48, user_tokens=16, output_tokens=4, concurrency=(2,))
DEFAULT_QUESTIONS = 100
SMOKE_QUESTIONS = 3
# NOTE: the engine of answer_quality.build_engine; prompts are laid out for this length.
MAX_MODEL_LEN = 4096


def run_benchmark(
    *,
    models: Sequence[str],
    num_questions: int,
    num_e2e_questions: int,
    squad_dir: Path,
    models_dir: Path,
    index_passages: int | None,
    kv_cache_mb: int,
    smoke: bool = False,
) -> dict:
    """One row per model; end to end needs Django set up (see `main`)."""
    from bench.squad_retrieval import passages_to_index, retrieve
    from inference.model_files import ModelSourceError, resolve_chat_model

    try:
        questions = load_questions(squad_dir, max(num_questions, num_e2e_questions))
        corpus = load_passages(squad_dir)
    except SquadDataError as error:
        raise CannotRunError(str(error)) from None
    e2e_questions = questions[:num_e2e_questions]
    retrieved = retrieve(e2e_questions, passages_to_index(e2e_questions, corpus, index_passages))
    workload = SMOKE_WORKLOAD if smoke else WORKLOAD
    rows = []
    for name in models:
        try:
            resolved = resolve_chat_model(name, models_dir)
        except ModelSourceError as error:
            raise CannotRunError(f"model {name}: {error}") from None
        is_instruct = name not in CATALOGUE or CATALOGUE[name].is_instruct
        e2e_prompts = (
            _end_to_end_prompts(resolved.directory, name, e2e_questions, retrieved.hits)
            if is_instruct
            else []
        )
        logger.info("measuring %s", name)
        child: dict = {
            "name": name,
            "model_dir": str(resolved.directory),
            "squad_dir": str(squad_dir),
            "num_questions": num_questions if is_instruct else 0,
            "e2e_prompts": e2e_prompts,
            "workload": asdict(workload),
            "kv_cache_mb": kv_cache_mb,
        }
        try:
            row = _in_fresh_process(child)
        except CannotRunError as error:
            # NOTE: one model that cannot be measured must not cost the others' rows.
            logger.error("%s", error)
            row = {"model": name, "error": str(error).splitlines()[-1]}
        logger.info("%s: %s", name, json.dumps(row))
        rows.append(row)
    return {
        "config": {
            "cpu": cpu_name(),
            "questions": num_questions,
            "e2e_questions": len(e2e_questions),
            "gold_retrieved": rounded(retrieved.gold_recall),
            "retrieval": {"passages": retrieved.num_passages, "top_k": retrieved.top_k},
            "workload": asdict(workload) | {"concurrency": workload.concurrency[0]},
        },
        "results": rows,
    }


def _end_to_end_prompts(model_dir: Path, name: str, questions, hits) -> list[list[int]]:
    """The chat's own layout of each question and its passages, with the model's tokenizer."""
    from transformers import AutoTokenizer

    from inference.prompts import PromptBuilder

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    builder = PromptBuilder(tokenizer, SHORT_ANSWER_PROMPT, max_model_len=MAX_MODEL_LEN)
    return end_to_end_prompts(builder, questions, hits, name)


def measure_model(arguments: dict) -> dict:
    """A child's work: load the model, measure its speed, answer the questions."""
    import torch

    model_dir = Path(arguments["model_dir"])
    workload = Workload.from_json(arguments["workload"])
    started = time.perf_counter()
    engine = build_engine(model_dir, "auto", dtype="auto", kv_cache_mb=arguments["kv_cache_mb"])
    load_s = time.perf_counter() - started
    try:
        report = engine.runner.load_report
        row: dict = {
            "model": arguments["name"],
            "checkpoint": report.checkpoint_format,
            "dtype": str(engine.config.dtype).removeprefix("torch."),
            "formats": report.formats,
            "weights_mb": rounded(report.weight_bytes / 2**20, 1),
            "checkpoint_mb": rounded(report.checkpoint_bytes / 2**20, 1),
            "weight_ratio": rounded(report.weight_ratio, 3),
            "load_s": rounded(load_s, 1),
            "load_peak_rss_mb": rounded(report.peak_rss_bytes / 2**20, 0),
            "torch_threads": torch.get_num_threads(),
        }
        speed = measure_speed(engine, workload, Seeds())
        row["decode_tok_s"] = speed["decode_tok_s"]
        row["concurrent_tok_s"] = speed["throughput_tok_s"][str(workload.concurrency[0])]
        row["gold_f1"] = row["e2e_f1"] = None
        if arguments["num_questions"]:
            questions = load_questions(Path(arguments["squad_dir"]), arguments["num_questions"])
            prompts = gold_passage_prompts(short_answer_builder(engine), questions)
            row["gold_f1"] = answer_all(engine, questions, prompts)["f1"]
        if arguments["e2e_prompts"]:
            prompts = arguments["e2e_prompts"]
            questions = load_questions(Path(arguments["squad_dir"]), len(prompts))
            row["e2e_f1"] = answer_all(engine, questions, prompts)["f1"]
    finally:
        engine.shutdown()
    return row


def _in_fresh_process(arguments: dict) -> dict:
    return run_in_fresh_process("bench.catalogue", arguments, label=arguments["name"])


def _child(arguments_file: str) -> int:
    logging.basicConfig(level=logging.WARNING)
    report_to_parent(measure_model(child_arguments(arguments_file)))
    return 0


def format_table(report: dict) -> str:
    config = report["config"]
    workload = config["workload"]
    lines = [
        f"The model catalogue on {config['cpu']}, each model as served by default "
        f"(quantization auto). Speed: {workload['system_tokens']}-token system prompt, "
        f"{workload['user_tokens']}-token user turn, {workload['output_tokens']} greedy tokens. "
        f"F1: squad-dev token F1, gold passage on {config['questions']} questions, end to end "
        f"(top {config['retrieval']['top_k']} of {config['retrieval']['passages']} passages, "
        f"gold passage retrieved for {config['gold_retrieved']:.0%}) on "
        f"{config['e2e_questions']}.",
        "",
        f"| model | weights | weight MiB (x tensors) | load s | load peak MiB | single-stream "
        f"tok/s | {workload['concurrency']}-concurrent tok/s | gold-passage F1 | end-to-end F1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        if "error" in row:
            lines.append(f"| {row['model']} | failed: {row['error']} |" + " |" * 7)
            continue
        formats = " + ".join(sorted(row["formats"]))
        lines.append(
            f"| {row['model']} | {row['checkpoint']} as {formats} | {row['weights_mb']:.0f} "
            f"({row['weight_ratio']:.2f}x) | {row['load_s']:.1f} | {row['load_peak_rss_mb']:.0f} | "
            f"{row['decode_tok_s']:.1f} | {row['concurrent_tok_s']:.1f} | "
            f"{_score(row['gold_f1'])} | {_score(row['e2e_f1'])} |"
        )
    return "\n".join(lines)


def _score(value: float | None) -> str:
    return "n/a (base model)" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.catalogue", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--model", action="append", help="repeat (default: the whole catalogue)")
    parser.add_argument("--questions", type=int, default=DEFAULT_QUESTIONS, help="gold passage")
    parser.add_argument(
        "--e2e-questions", type=int, help="end to end (default: as many as --questions)"
    )
    parser.add_argument("--squad-dir", type=Path, default=DEFAULT_SQUAD_DIR)
    parser.add_argument(
        "--index-passages",
        type=int,
        help="end to end: index the first N corpus passages and the gold ones (default: all)",
    )
    parser.add_argument("--models-dir", type=Path, default=None, help="default: the data dir's")
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--smoke", action="store_true", help="the bundled model, tiny sizes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child)
    if args.smoke:
        args.questions = SMOKE_QUESTIONS
        args.index_passages = (
            SMOKE_INDEX_PASSAGES if args.index_passages is None else args.index_passages
        )
    num_e2e_questions = args.questions if args.e2e_questions is None else args.e2e_questions
    if args.questions < 1 or num_e2e_questions < 1:
        parser.error("--questions and --e2e-questions must be at least 1")
    models_dir = args.models_dir or default_models_dir()  # before the scratch site moves it

    def run() -> dict:
        with scratch_site():
            return run_benchmark(
                models=args.model or ([BUNDLED_CHAT_MODEL] if args.smoke else list(CATALOGUE)),
                num_questions=args.questions,
                num_e2e_questions=num_e2e_questions,
                squad_dir=args.squad_dir,
                models_dir=models_dir,
                index_passages=args.index_passages,
                kv_cache_mb=args.kv_cache_mb,
                smoke=args.smoke,
            )

    return run_cli(run, as_json=args.json, format_report=format_table)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
