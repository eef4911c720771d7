"""The optimization table: what each engine feature buys, every row measured in the same run.

`python -m bench.engine --table` builds one engine per row on the same weights and workload
(a shared ~1,000-token system prompt, a unique ~250-token user turn, 64 greedy tokens with
ignore_eos), the rows adding one feature at a time as practitioners publish for vLLM:

- TTFT p50 and single-request tokens/s: requests sent one after another (after one warm-up
  request that puts the system prompt in the prefix cache, where there is one);
- throughput: 32 requests submitted at once (served one at a time where `max_num_seqs` is 1);
- memory: the model's weights plus the peak KV cache the 32 requests held;
- quality: perplexity of the row's weight/KV format on shipped English text, against bf16, and
  answer quality: gold-passage token F1 on the first squad-dev questions (bench.answer_quality).

A separate measurement runs speculative decoding on an extractive workload (the answer quotes
the prompt), off and on, and checks the greedy text is identical. Results go to
`docs/benchmarks.md`, a PNG chart and the JSON (`docs/benchmarks.json`, read by the staff
dashboard) next to it; the JSON is printed too.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from bench.peak_sampler import PeakSampler
from bench.workload import Seeds, Workload, build_prompts
from inference.torch_threads import run_on_short_lived_thread

logger = logging.getLogger(__name__)

QUALITY_TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "squad_passages.txt"
SPECULATIVE_TOKENS = 5


@dataclass(frozen=True, slots=True)
class TableRow:
    name: str
    settings: dict  # EngineConfig keyword arguments on top of the defaults below


ROWS: tuple[TableRow, ...] = (
    TableRow("baseline: bf16, no prefix cache, one request at a time",
             {"enable_prefix_caching": False, "max_num_seqs": 1}),
    TableRow("+ prefix cache", {"max_num_seqs": 1}),
    TableRow("+ continuous batching", {}),
    TableRow("+ int8 weights", {"quantization": "int8"}),
    TableRow("+ int4 weights", {"quantization": "int4"}),
    TableRow("+ speculative decoding", {"num_speculative_tokens": SPECULATIVE_TOKENS}),
    TableRow("all together: int4 + 8-bit KV + speculative",
             {"quantization": "int4", "kv_cache_dtype": "int8",
              "num_speculative_tokens": SPECULATIVE_TOKENS}),
)  # fmt: skip


@dataclass(slots=True)
class TableWorkload:
    system_tokens: int = 1000
    user_tokens: int = 250
    output_tokens: int = 64
    num_single: int = 5  # sequential requests for TTFT p50 and single-request tokens/s
    concurrency: int = 32
    quality_tokens: int = 4096
    answer_questions: int = 30  # gold-passage F1 (bench.answer_quality) per weight/KV format
    extractive_passage_tokens: int = 400
    extractive_output_tokens: int = 160


SMOKE_TABLE = TableWorkload(
    system_tokens=48, user_tokens=16, output_tokens=4, num_single=2, concurrency=3,
    quality_tokens=96, answer_questions=3, extractive_passage_tokens=48,
    extractive_output_tokens=8,
)  # fmt: skip


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def kv_cache_bytes(runner) -> int:
    return sum(tensor_bytes(layer) for layer in runner.kv_cache.layers)


def engine_config(model_dir: Path, workload: TableWorkload, settings: dict, kv_cache_mb: int):
    from inference.engine import EngineConfig

    base = {
        "dtype": torch.bfloat16,
        # NOTE: the rows name their weight format; a GGUF's own ("auto") is not the bf16 baseline.
        "quantization": "none",
        "max_model_len": max(2048, workload.system_tokens + workload.user_tokens + 256),
        "kv_cache_mb": kv_cache_mb,
        "max_num_seqs": max(workload.concurrency, 1),
        "max_num_batched_tokens": 512,
    }
    return EngineConfig(model_dir=model_dir, **(base | settings))


def measure_row(
    model_dir: Path, row: TableRow, workload: TableWorkload, prompts: dict, kv_cache_mb: int
) -> dict:
    from inference.engine import Engine, SamplingParams, model_weight_bytes

    params = SamplingParams(temperature=0, max_tokens=workload.output_tokens, ignore_eos=True)
    engine = Engine(engine_config(model_dir, workload, row.settings, kv_cache_mb))
    try:
        engine.generate([prompts["warmup"]], params)
        singles = [engine.generate([p], params)[0].usage for p in prompts["single"]]
        with PeakSampler(lambda: engine.metrics.snapshot()["kv_usage"], 0.02) as kv_usage:
            started = time.perf_counter()
            results = engine.generate(prompts["concurrent"], params)
            seconds = time.perf_counter() - started
        snapshot = engine.metrics.snapshot()
        weights = model_weight_bytes(engine.runner.model)
        kv_peak = kv_usage.peak * kv_cache_bytes(engine.runner)
    finally:
        engine.shutdown()
    return {
        "name": row.name,
        "settings": {k: str(v) for k, v in row.settings.items()},
        "ttft_p50_s": round(statistics.median(u.ttft_s for u in singles), 4),
        "single_tok_s": round(statistics.median(u.tokens_per_s for u in singles), 2),
        "throughput_tok_s": round(sum(r.usage.completion_tokens for r in results) / seconds, 2),
        "weights_mb": round(weights / 2**20, 1),
        "kv_peak_mb": round(kv_peak / 2**20, 1),
        "spec_acceptance_rate": round(float(snapshot.get("spec_acceptance_rate") or 0.0), 3),
    }


def quality(model_dir: Path, token_ids: list[int], settings: dict) -> float:
    """Perplexity of the row's weight and KV formats (on a thread of its own: see torch_threads)."""
    from bench.perplexity import perplexity
    from inference.engine import EngineConfig, ModelRunner

    def run() -> float:
        config = EngineConfig(
            model_dir,
            dtype=torch.bfloat16,
            kv_cache_mb=64,
            block_size=16,
            max_model_len=1024,
            quantization=settings.get("quantization", "none"),
            kv_cache_dtype=settings.get("kv_cache_dtype", "auto"),
        )
        runner = ModelRunner(config)
        return perplexity(runner, token_ids, window=1024, chunk=256)

    return run_on_short_lived_thread(run)


def extractive_prompt(tokenizer, passage: str) -> list[int]:
    messages = [
        {"role": "system", "content": "You copy text exactly."},
        {"role": "user", "content": f"{passage}\n\nRepeat the text above word for word."},
    ]
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def measure_speculative(
    model_dir: Path, workload: TableWorkload, prompt: list[int], kv_cache_mb: int
) -> dict:
    """Single-stream greedy decode of a quoting answer, speculation off then on."""
    from inference.engine import Engine, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=workload.extractive_output_tokens)
    runs = {}
    for label, num_speculative in (("off", 0), ("on", SPECULATIVE_TOKENS)):
        settings = {"num_speculative_tokens": num_speculative}
        engine = Engine(engine_config(model_dir, workload, settings, kv_cache_mb))
        try:
            engine.generate([prompt], SamplingParams(temperature=0, max_tokens=2))  # warm-up
            [result] = engine.generate([prompt], params)
            snapshot = engine.metrics.snapshot()
        finally:
            engine.shutdown()
        runs[label] = {
            "tok_s": round(result.usage.tokens_per_s, 2),
            "completion_tokens": result.usage.completion_tokens,
            "acceptance_rate": round(float(snapshot.get("spec_acceptance_rate") or 0.0), 3),
            "token_ids": result.token_ids,
        }
    off, on = runs["off"], runs["on"]
    return {
        "num_speculative_tokens": SPECULATIVE_TOKENS,
        "off_tok_s": off["tok_s"],
        "on_tok_s": on["tok_s"],
        "speedup": round(on["tok_s"] / off["tok_s"], 3) if off["tok_s"] else 0.0,
        "completion_tokens": on["completion_tokens"],
        "acceptance_rate": on["acceptance_rate"],
        "identical_text": off["token_ids"] == on["token_ids"],
    }


def build_table(
    model_dir: Path,
    tokenizer,
    workload: TableWorkload,
    *,
    kv_cache_mb: int = 1024,
    rows: tuple[TableRow, ...] = ROWS,
) -> dict:
    prompt_workload = Workload(
        system_tokens=workload.system_tokens, user_tokens=workload.user_tokens
    )
    seeds = Seeds()
    # NOTE: the same prompts for every row, so rows differ only in the engine's settings.
    prompts = {
        "warmup": build_prompts(tokenizer, prompt_workload, 1, seeds.take(1))[0],
        "single": build_prompts(tokenizer, prompt_workload, workload.num_single, seeds.take(99)),
        "concurrent": build_prompts(
            tokenizer, prompt_workload, workload.concurrency, seeds.take(workload.concurrency)
        ),
    }
    prompts["single"] = prompts["single"][: workload.num_single]
    measured = []
    for row in rows:
        logger.info("measuring %s", row.name)
        measured.append(measure_row(model_dir, row, workload, prompts, kv_cache_mb))

    text_ids = tokenizer(QUALITY_TEXT.read_text())["input_ids"][: workload.quality_tokens]
    perplexities: dict[tuple[str, str], float] = {}
    row_perplexities = []
    for row, result in zip(rows, measured, strict=True):
        key = (row.settings.get("quantization", "none"), row.settings.get("kv_cache_dtype", "auto"))
        if key not in perplexities:
            perplexities[key] = quality(model_dir, text_ids, row.settings)
        result["perplexity"] = round(perplexities[key], 4)
        row_perplexities.append(perplexities[key])
    reference = perplexities[("none", "auto")]
    _add_answer_f1(model_dir, rows, measured, workload.answer_questions)
    baseline = measured[0]
    # NOTE: changes from the unrounded values, so the reference's own row reads +0.0%, not -0.0%
    for result, perplexity in zip(measured, row_perplexities, strict=True):
        result["perplexity_change"] = round(perplexity / reference - 1, 4)
        result["single_tok_s_vs_baseline"] = _ratio(
            result["single_tok_s"], baseline["single_tok_s"]
        )
        result["throughput_vs_baseline"] = _ratio(
            result["throughput_tok_s"], baseline["throughput_tok_s"]
        )

    passage = tokenizer.decode(
        tokenizer(QUALITY_TEXT.read_text())["input_ids"][: workload.extractive_passage_tokens]
    )
    speculative = measure_speculative(
        model_dir, workload, extractive_prompt(tokenizer, passage), kv_cache_mb
    )
    return {
        "workload": {
            "system_tokens": workload.system_tokens,
            "user_tokens": workload.user_tokens,
            "output_tokens": workload.output_tokens,
            "concurrency": workload.concurrency,
            "quality_tokens": len(text_ids),
            "answer_questions": workload.answer_questions,
            "torch_threads": torch.get_num_threads(),
        },
        "rows": measured,
        "speculative_extractive": speculative,
    }


def write_table(
    model_dir: Path, *, smoke: bool, kv_cache_mb: int, out: Path, chart: Path, command: str
) -> dict:
    """Measure the table (`SMOKE_TABLE` sizes if `smoke`), write it to `out` and its chart to
    `chart` (linked from `out` by a relative path where it can be); the table."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    workload = SMOKE_TABLE if smoke else TableWorkload()
    table = build_table(model_dir, tokenizer, workload, kv_cache_mb=kv_cache_mb)
    render_chart(table, chart)
    chart_name = (
        str(chart.relative_to(out.parent)) if chart.is_relative_to(out.parent) else str(chart)
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_markdown(table, command, chart_name))
    write_table_json(table, out.with_suffix(".json"), command=command, chart_name=chart_name)
    return table


def write_table_json(table: dict, path: Path, *, command: str, chart_name: str | None) -> None:
    """The table in machine-readable form beside its markdown: the staff dashboard shows the
    last run from it (frontend/dashboard.py)."""
    measured = {
        "command": command,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "chart": chart_name,
    }
    path.write_text(json.dumps(measured | table, indent=2) + "\n")


def _add_answer_f1(
    model_dir: Path, rows: tuple[TableRow, ...], measured: list[dict], num_questions: int
) -> None:
    """Each row's gold-passage F1, measured once per weight/KV format (the rest of a row's
    settings leave greedy answers unchanged)."""
    from bench.answer_quality import gold_passage_f1
    from bench.squad_questions import load_questions

    questions = load_questions(limit=num_questions)
    scores: dict[tuple[str, str], float] = {}
    for row, result in zip(rows, measured, strict=True):
        key = (row.settings.get("quantization", "none"), row.settings.get("kv_cache_dtype", "auto"))
        if key not in scores:
            logger.info("answer quality of %s", row.name)
            scores[key] = gold_passage_f1(
                model_dir, questions, quantization=key[0], kv_cache_dtype=key[1]
            )
        result["answer_f1"] = round(scores[key], 3)


def _ratio(value: float, reference: float) -> float:
    return round(value / reference, 2) if reference else 0.0


def render_markdown(table: dict, command: str, chart_name: str | None) -> str:
    workload = table["workload"]
    lines = [
        "# Engine optimization table",
        "",
        f"Produced by `{command}` (all rows measured in one run, on this machine).",
        f"Workload: a shared {workload['system_tokens']}-token system prompt, a unique "
        f"{workload['user_tokens']}-token user turn, {workload['output_tokens']} greedy tokens "
        f"(ignore_eos); throughput with {workload['concurrency']} requests at once; quality is "
        f"perplexity on {workload['quality_tokens']} tokens of English text against bf16; answer "
        f"F1 is gold-passage token F1 on the first {workload['answer_questions']} squad-dev "
        "questions (`python -m bench.answer_quality`).",
        "",
        "| step | TTFT p50 (s) | single-request tok/s | throughput at "
        f"{workload['concurrency']} (tok/s) | weights + peak KV (MB) | quality (perplexity) | "
        "answer F1 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in table["rows"]:
        lines.append(
            f"| {row['name']} | {row['ttft_p50_s']:.3f} | {row['single_tok_s']:.1f} "
            f"({row['single_tok_s_vs_baseline']:.2f}x) | {row['throughput_tok_s']:.1f} "
            f"({row['throughput_vs_baseline']:.2f}x) | {row['weights_mb']:.0f} + "
            f"{row['kv_peak_mb']:.0f} | {row['perplexity']:.2f} "
            f"({row['perplexity_change']:+.1%}) | {row['answer_f1']:.3f} |"
        )
    spec = table["speculative_extractive"]
    lines += [
        "",
        "Speculative decoding (n-gram prompt lookup, "
        f"{spec['num_speculative_tokens']} draft tokens) on an extractive answer (the model "
        f"quotes a passage from its prompt, {spec['completion_tokens']} tokens, single stream): "
        f"{spec['off_tok_s']:.1f} -> {spec['on_tok_s']:.1f} tok/s ({spec['speedup']:.2f}x), "
        f"acceptance rate {spec['acceptance_rate']:.0%}, identical greedy text: "
        f"{'yes' if spec['identical_text'] else 'NO'}.",
    ]
    if chart_name:
        lines += ["", f"![optimization chart]({chart_name})"]
    return "\n".join(lines) + "\n"


def render_chart(table: dict, path: Path) -> None:
    """Three bar panels (TTFT p50, single-request tok/s, throughput), one bar per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table["rows"]
    labels = [f"{i}. {row['name'].split(':')[0]}" for i, row in enumerate(rows, 1)]
    panels = (
        ("ttft_p50_s", "TTFT p50 (s, lower is better)"),
        ("single_tok_s", "single-request tok/s"),
        ("throughput_tok_s", f"throughput at {table['workload']['concurrency']} (tok/s)"),
    )
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    positions = list(range(len(rows)))
    for axis, (key, title) in zip(axes, panels, strict=True):
        axis.barh(positions, [row[key] for row in rows], color="#4c72b0")
        axis.set_yticks(positions, labels if axis is axes[0] else [""] * len(rows))
        axis.invert_yaxis()
        axis.set_title(title)
        axis.grid(axis="x", alpha=0.3)
    figure.suptitle("Cachet engine, SmolLM2-135M on this CPU: one feature at a time")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
