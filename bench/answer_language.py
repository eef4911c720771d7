"""Answers in the question's language: the built-in system prompt before and after its language
sentence (issue 20), side by side on the Debian Reference sets (eval/).

Each question is answered twice on one engine, greedy, at most 64 new tokens, under the old
built-in system prompt (chat/migrations/0003's OLD_DEFAULT) and under the current one
(chat.models.DEFAULT_SYSTEM_PROMPT), in two modes laid out by the chat turn's own builder
(chat.prompt: numbered passages, today's facts, the question):

- **gold passage**: the question's own passage alone, as passage [1];
- **end to end**: the set's corpus ingested into a throwaway collection and each question
  searched as a chat turn searches (bench.squad_retrieval, the site's embedder and reranker).

Sets (`--set`, repeat): `zh` (Chinese questions, Chinese passages), `cross` (Chinese questions,
English passages), `cross-en` (English questions, Chinese passages). Scores:

- **in language**: the share of answers in the question's language (Chinese when over half of
  the answer is Chinese: evals.answer_metrics.cjk_share);
- **character F1 / recall** (sets with reference answers: `zh`): against the reference answers of
  eval/debian-reference-zh/answers.jsonl, each made of excerpts copied from the question's
  passage; Chinese counted character by character (evals.answer_metrics.chinese_tokens). The
  answers are sentences, so recall (is the answer's content there) reads more directly than F1;
- **cites gold**: the share of answers that cite the gold passage's "[n]" (end to end: none
  where retrieval missed it); **cites**: the share that cite any passage.

A set with answers.jsonl is measured on its answered questions, in file order; one without, on
`--questions` evenly spaced questions. The model is served as the product serves it
(quantization and dtype "auto": the default model's GGUF stays Q4_K_M).

    python -m bench.answer_language                      # zh, the default model, 60 questions
    python -m bench.answer_language --set zh --set cross --questions 30 --json
    python -m bench.answer_language --smoke              # the bundled model, 4 questions
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.answer_quality import (
    MODE_NAMES,
    add_run_arguments,
    build_engine,
    end_to_end_prompts,
    parse_run_arguments,
    scratch_site,
)
from bench.squad_questions import (
    Passage,
    SquadDataError,
    SquadQuestion,
    gold_passage_ids,
    read_jsonl,
)
from evals.answer_metrics import cjk_share, is_chinese, score_chinese_answer
from harness import CannotRunError, chat_model_dir, cpu_name, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL, DEFAULT_CHAT_MODEL

logger = logging.getLogger(__name__)

EVAL_DIR = Path(__file__).resolve().parents[1] / "eval"
SETS = {
    "zh": "debian-reference-zh",
    "cross": "debian-reference-cross",
    "cross-en": "debian-reference-cross-en",
}
SET_NAMES = {
    "zh": "zh questions, zh passages",
    "cross": "zh questions, en passages",
    "cross-en": "en questions, zh passages",
}
SYSTEM_PROMPTS = ("old", "new")
MAX_ANSWER_TOKENS = 64
DEFAULT_QUESTIONS = 60
SMOKE_QUESTIONS = 4
CITATION = re.compile(r"\[(\d+)\]")


def system_prompts() -> dict[str, str]:
    """The built-in system prompt before issue 20's language sentence, and now."""
    from chat.models import DEFAULT_SYSTEM_PROMPT

    # NOTE: the old text is the migration's, the one place that keeps it.
    migration = importlib.import_module("chat.migrations.0003_default_prompt_answer_language")
    return {"old": migration.OLD_DEFAULT, "new": DEFAULT_SYSTEM_PROMPT}


def load_set(directory: Path, limit: int | None) -> list[SquadQuestion]:
    """The set's questions with their gold passages: the answered ones (first `limit`) where
    the set has answers.jsonl, else `limit` evenly spaced ones (all if None)."""
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        if not (directory / name).is_file():
            raise SquadDataError(f"{directory} is not a BEIR-layout set: no {name}")
    passages = {passage.passage_id: passage for passage in load_corpus(directory)}
    gold = gold_passage_ids(directory / "qrels/test.tsv")
    rows = read_jsonl(directory / "queries.jsonl", ("_id", "text"))
    answers: dict[str, tuple[str, ...]] = {}
    if (directory / "answers.jsonl").is_file():
        answers = {
            row["_id"]: tuple(row["answers"])
            for row in read_jsonl(directory / "answers.jsonl", ("_id", "answers"))
        }
        rows = [row for row in rows if row["_id"] in answers][:limit]
    elif limit is not None and limit < len(rows):
        rows = [rows[round(i * len(rows) / limit)] for i in range(limit)]
    questions = []
    for row in rows:
        passage = passages.get(gold.get(row["_id"], ""))
        if passage is None:
            raise SquadDataError(f"{directory}: question {row['_id']} has no gold passage")
        questions.append(
            SquadQuestion(row["_id"], row["text"], answers.get(row["_id"], ()), passage)
        )
    return questions


def load_corpus(directory: Path) -> list[Passage]:
    return [
        Passage(row["_id"], str(row.get("title", "")), row["text"])
        for row in read_jsonl(directory / "corpus.jsonl", ("_id", "text"))
    ]


def gold_hit(passage: Passage):
    """The gold passage as the one search hit of a turn (its citation is [1])."""
    from retrieval.search import SearchHit

    return SearchHit(
        chunk_id=0, score=1.0, text=passage.text, document_id=0, document_title=passage.title,
        collection_id=0, collection_name="eval", ordinal=0, page=None, char_start=0,
        char_end=len(passage.text),
    )  # fmt: skip


def answer_and_score(
    engine,
    questions: Sequence[SquadQuestion],
    prompts: list[list[int]],
    gold_numbers: Sequence[int | None],
) -> dict:
    """Every answer in one batch, scored for language, citations and (with references) F1."""
    from inference.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_ANSWER_TOKENS)
    started = time.perf_counter()
    results = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    answers = []
    for question, result, gold in zip(questions, results, gold_numbers, strict=True):
        cited = sorted({int(n) for n in CITATION.findall(result.text)})
        answer = {
            "question_id": question.question_id,
            "answer": result.text.strip(),
            "cjk_share": rounded(cjk_share(result.text), 3),
            "in_language": is_chinese(result.text) == is_chinese(question.question),
            "cited": cited,
            "cites_gold": gold in cited,
            "answer_tokens": result.usage.completion_tokens,
        }
        if question.answers:
            score = score_chinese_answer(result.text, question.answers)
            answer |= {"f1": rounded(score.f1, 3), "recall": rounded(score.recall, 3)}
        answers.append(answer)
    row = {
        "num_questions": len(answers),
        "in_language": rounded(statistics.fmean(a["in_language"] for a in answers)),
        "cites": rounded(statistics.fmean(bool(a["cited"]) for a in answers)),
        "cites_gold": rounded(statistics.fmean(a["cites_gold"] for a in answers)),
        "mean_answer_tokens": rounded(statistics.fmean(a["answer_tokens"] for a in answers), 1),
        "mean_prompt_tokens": rounded(statistics.fmean(map(len, prompts)), 1),
        "seconds": rounded(seconds, 1),
        "answers": answers,
    }
    if all("f1" in a for a in answers):
        row["f1"] = rounded(statistics.fmean(a["f1"] for a in answers))
        row["recall"] = rounded(statistics.fmean(a["recall"] for a in answers))
    return row


def measure_set(
    engine,
    model_name: str,
    set_name: str,
    questions,
    retrieved,
    *,
    modes: Sequence[str],
    prompts_by_name: dict[str, str],
) -> list[dict]:
    """Every system prompt in every mode on one set, on one engine."""
    from inference.prompts import PromptBuilder

    rows = []
    for prompt_name, system_prompt in prompts_by_name.items():
        builder = PromptBuilder(
            engine.tokenizer, system_prompt, max_model_len=engine.max_model_len,
            tokenizer_lock=engine.tokenizer_lock,
        )  # fmt: skip
        for mode in modes:
            logger.info(
                "%s, %s prompt, %s: %d questions", set_name, prompt_name, mode, len(questions)
            )
            if mode == "gold":
                hits = [[gold_hit(q.passage)] for q in questions]
                gold_numbers: Sequence[int | None] = [1] * len(questions)
            else:
                hits, gold_numbers = retrieved.hits, retrieved.gold_numbers
            prompts = end_to_end_prompts(builder, questions, hits, model_name)
            row = {"set": set_name, "system_prompt": prompt_name, "mode": mode}
            row |= answer_and_score(engine, questions, prompts, gold_numbers)
            if mode == "e2e":
                row["gold_retrieved"] = rounded(retrieved.gold_recall)
            rows.append(row)
    return rows


def run_benchmark(
    *,
    model: str,
    sets: Sequence[str],
    modes: Sequence[str],
    num_questions: int,
    eval_dir: Path,
    models_dir: Path,
    index_passages: int | None,
    top_k: int | None,
    kv_cache_mb: int,
    candidates: Sequence[str] = (),
) -> dict:
    """Every set with the old and new system prompts (and `candidates`, named candidate1...)."""
    from bench.squad_retrieval import passages_to_index, retrieve

    questions, retrieved = {}, {}
    try:
        for name in sets:
            questions[name] = load_set(eval_dir / SETS[name], num_questions)
            if "e2e" in modes:
                corpus = load_corpus(eval_dir / SETS[name])
                passages = passages_to_index(questions[name], corpus, index_passages)
                retrieved[name] = retrieve(questions[name], passages, top_k=top_k)
    except SquadDataError as error:
        raise CannotRunError(str(error)) from None
    model_dir = chat_model_dir(model, models_dir)
    prompts_by_name = system_prompts() | {
        f"candidate{number}": text for number, text in enumerate(candidates, start=1)
    }
    engine = build_engine(model_dir, "auto", dtype="auto", kv_cache_mb=kv_cache_mb)
    try:
        config = {
            "model": model,
            "dtype": str(engine.config.dtype).removeprefix("torch."),
            "questions": {name: len(questions[name]) for name in sets},
            "max_answer_tokens": MAX_ANSWER_TOKENS,
            "system_prompts": prompts_by_name,
            "torch_threads": _torch_threads(),
            "cpu": cpu_name(),
        }
        if retrieved:
            config["retrieval"] = {
                name: {"passages": found.num_passages, "top_k": found.top_k}
                for name, found in retrieved.items()
            }
        results = []
        for name in sets:
            results += measure_set(
                engine, model, name, questions[name], retrieved.get(name), modes=modes,
                prompts_by_name=prompts_by_name,
            )  # fmt: skip
    finally:
        engine.shutdown()
        del engine
        gc.collect()
    return {"config": config, "results": results, "ratios": ratios(results)}


def ratios(results: Sequence[dict]) -> list[dict]:
    """Each prompt / the old prompt per set and mode, for each score the old prompt has above 0."""
    old = {(r["set"], r["mode"]): r for r in results if r["system_prompt"] == "old"}
    out = []
    for row in results:
        base = old.get((row["set"], row["mode"]))
        if row["system_prompt"] == "old" or base is None:
            continue
        ratio = {"set": row["set"], "mode": row["mode"], "system_prompt": row["system_prompt"]}
        for score in ("in_language", "f1", "recall", "cites_gold"):
            if base.get(score):
                ratio[score] = rounded(row[score] / base[score], 3)
        out.append(ratio)
    return out


def format_table(report: dict) -> str:
    config = report["config"]
    counts = ", ".join(f"{SETS[name]} {n}" for name, n in config["questions"].items())
    lines = [
        f"Answers in the question's language: {config['model']} ({config['dtype']}), greedy, at "
        f"most {config['max_answer_tokens']} answer tokens, {config['torch_threads']} torch "
        f"threads ({config['cpu']}). Questions: {counts}.",
        "",
        "| set | mode | system prompt | in language | char F1 | char recall | cites gold | "
        "cites | gold retrieved | answer tokens | seconds |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        lines.append(
            f"| {SET_NAMES[row['set']]} | {MODE_NAMES[row['mode']]} | {row['system_prompt']} | "
            f"{row['in_language']:.0%} | {_score(row, 'f1')} | {_score(row, 'recall')} | "
            f"{row['cites_gold']:.0%} | {row['cites']:.0%} | "
            f"{_percent(row.get('gold_retrieved'))} | {row['mean_answer_tokens']:.1f} | "
            f"{row['seconds']:.1f} |"
        )
    lines += [
        "",
        "| set | mode | system prompt / old: | in language | char F1 | char recall | cites gold |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for row in report["ratios"]:
        lines.append(
            f"| {SET_NAMES[row['set']]} | {MODE_NAMES[row['mode']]} | {row['system_prompt']} | "
            + " | ".join(_score(row, key) for key in ("in_language", "f1", "recall", "cites_gold"))
            + " |"
        )
    return "\n".join(lines)


def _score(row: dict, key: str) -> str:
    return f"{row[key]:.3f}" if key in row else "-"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.answer_language", description=__doc__.splitlines()[0]
    )
    add_run_arguments(parser, questions=DEFAULT_QUESTIONS, smoke=SMOKE_QUESTIONS)
    parser.add_argument(
        "--model",
        help="as CACHET_MODEL takes it (default: the catalogue's default model; with --smoke "
        "its bundled one)",
    )
    parser.add_argument("--set", action="append", choices=SETS, help="repeat (default: zh)")
    parser.add_argument("--eval-dir", type=Path, default=EVAL_DIR)
    parser.add_argument(
        "--candidate",
        action="append",
        default=[],
        help="another system prompt to measure beside the old and new ones; repeat",
    )
    args, modes, models_dir = parse_run_arguments(parser, argv, smoke=SMOKE_QUESTIONS)

    def run() -> dict:
        # NOTE: a site even for the gold passage alone: the prompt builder is the chat's.
        with scratch_site():
            return run_benchmark(
                model=args.model or (BUNDLED_CHAT_MODEL if args.smoke else DEFAULT_CHAT_MODEL),
                sets=tuple(dict.fromkeys(args.set or ["zh"])),
                modes=modes,
                num_questions=args.questions,
                eval_dir=args.eval_dir,
                models_dir=models_dir,
                index_passages=args.index_passages,
                top_k=args.top_k,
                kv_cache_mb=args.kv_cache_mb,
                candidates=args.candidate,
            )

    return run_cli(run, as_json=args.json, format_report=format_table, num_errors=lambda r: 0)


if __name__ == "__main__":
    sys.exit(main())
