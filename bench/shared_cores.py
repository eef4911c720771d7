"""Chat speed while another process works on the same cores, with and without adaptive threads.

A decode step is hundreds of OpenMP parallel regions, each as slow as its slowest thread; when
another process keeps a core busy, one engine thread waits for a scheduler slice at nearly
every region. Cachet answers with fewer threads while others keep cores busy
(inference/engine/core_share.py) and by running its own ingestion niced
(inference/torch_threads.py). This measures both, in one run, each configuration in a fresh
process (bench.fresh_process):

- threads: `adaptive` (Cachet's default) or `fixed` (`adaptive_threads=False`, one thread per
  core throughout: the baseline);
- neighbour: `none`; `ingestion`, a process embedding passages in batches with retrieval's
  Embedder as an ingestion does (niced, as Cachet runs it); `busy`, an unniced process running
  float32 matmuls on every core (another service, a noisy neighbour).

Columns: single-stream decode and throughput at 8 concurrent (bench.workload's prompts: a
256-token system prompt, a 64-token user turn, 64 greedy tokens), each as a share of the same
threads' idle figure, and the neighbour's own rate alone and while the chat ran.

    python -m bench.shared_cores                        # the bundled model
    python -m bench.shared_cores --model qwen2.5-coder-0.5b-instruct --json
    python -m bench.shared_cores --smoke                # tiny sizes, `adaptive` next to
                                                        # nothing and to an ingestion only
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from bench.engine import configuration_engine_config, measure_speed
from bench.fresh_process import child_arguments, report_to_parent, run_in_fresh_process
from bench.workload import WORDS, Seeds, Workload
from harness import CannotRunError, cpu_name, default_models_dir, rounded, run_cli
from inference.catalogue import BUNDLED_CHAT_MODEL

logger = logging.getLogger(__name__)

WORKLOAD = Workload(system_tokens=256, user_tokens=64, output_tokens=64, concurrency=(8,))
SMOKE_WORKLOAD = Workload(system_tokens=48, user_tokens=16, output_tokens=8, concurrency=(2,))
THREADS = ("adaptive", "fixed")
NEIGHBOURS = ("none", "ingestion", "busy")
NEIGHBOUR_ALONE_S = 4.0  # how long the neighbour's own rate is measured before the chat starts
READY_TIMEOUT_S = 120.0
# Passages per embedding batch: small batches report progress often enough to see it during a
# short chat, and more than inference/torch_threads.py's small batch, so they run as an
# ingestion's do (niced, on a short-lived thread).
BATCH = 12


# ---- the neighbour process ----


def run_neighbour(kind: str) -> None:
    """Work until killed, printing `ready` once warm, then the running count of units done."""
    if kind == "ingestion":
        from retrieval.embeddings import load_embedder

        embedder = load_embedder(None)  # the default embedding model, as ingestion runs it
        rng = random.Random(0)
        passages = [" ".join(rng.choice(WORDS) for _ in range(120)) for _ in range(BATCH)]

        def work() -> None:
            embedder.encode(passages)  # batches run niced on a short-lived thread

        units = BATCH
    else:
        import torch

        a, b = torch.randn(512, 512), torch.randn(512, 512)

        def work() -> None:
            torch.mm(a, b)

        units = 1
    work()
    print("ready", flush=True)
    done = 0
    while True:
        work()
        done += units
        print(done, flush=True)


class Neighbour:
    """A running neighbour process and the count of units it reported (read by a thread)."""

    def __init__(self, kind: str) -> None:
        self.kind, self.units = kind, 0
        self.step = 1  # units per report
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.shared_cores", "--neighbour", kind],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._ready = threading.Event()
        threading.Thread(target=self._read_reports, daemon=True).start()
        if not self._ready.wait(READY_TIMEOUT_S):
            self.stop()
            raise CannotRunError(f"the {kind} neighbour did not start")

    def _read_reports(self) -> None:
        for line in self._process.stdout:  # type: ignore[union-attr]
            if line.strip() == "ready":
                self._ready.set()
            elif line.strip().isdigit():
                self.step = int(line) - self.units
                self.units = int(line)

    def rate_alone(self, seconds: float) -> float:
        """Units per second over at least `seconds` and at least two reports."""
        first_units, started = self.units, time.perf_counter()
        while time.perf_counter() - started < seconds or self.units < first_units + 2 * self.step:
            if self._process.poll() is not None:
                raise CannotRunError(f"the {self.kind} neighbour exited")
            time.sleep(0.05)
        return (self.units - first_units) / (time.perf_counter() - started)

    def stop(self) -> None:
        self._process.kill()
        self._process.wait()


@contextlib.contextmanager
def neighbour_running(kind: str) -> Iterator[Neighbour | None]:
    if kind == "none":
        yield None
        return
    neighbour = Neighbour(kind)
    try:
        yield neighbour
    finally:
        neighbour.stop()


# ---- one configuration, in a fresh process ----


def measure(arguments: dict) -> dict:
    """A child's work: the engine with its threads setting, next to its neighbour."""
    import torch

    from inference.engine import Engine

    workload = Workload.from_json(arguments["workload"])
    config = configuration_engine_config(
        Path(arguments["model_dir"]), adaptive_threads=arguments["threads"] == "adaptive"
    )
    engine = Engine(config)
    try:
        with neighbour_running(arguments["neighbour"]) as neighbour:
            alone_rate = chat_rate = None
            if neighbour is not None:
                alone_rate = neighbour.rate_alone(arguments["neighbour_alone_s"])
                start_units, started = neighbour.units, time.perf_counter()
            speed = measure_speed(engine, workload, Seeds())
            if neighbour is not None:
                chat_rate = (neighbour.units - start_units) / (time.perf_counter() - started)
        core_share = engine.core_share
        return {
            "dtype": str(engine.config.dtype).removeprefix("torch."),
            "max_threads": core_share.max_threads if core_share else torch.get_num_threads(),
            "threads_at_end": core_share.current_threads if core_share else torch.get_num_threads(),
            "decode_tok_s": speed["decode_tok_s"],
            "concurrent_tok_s": speed["throughput_tok_s"][str(workload.concurrency[0])],
            "neighbour_alone_per_s": rounded(alone_rate, 1),
            "neighbour_with_chat_per_s": rounded(chat_rate, 1),
        }
    finally:
        engine.shutdown()


def run_benchmark(
    *,
    model: str,
    models_dir: Path,
    threads_modes: tuple[str, ...] = THREADS,
    neighbours: tuple[str, ...] = NEIGHBOURS,
    smoke: bool = False,
) -> dict:
    from inference.model_files import ModelSourceError, resolve_chat_model

    try:
        model_dir = resolve_chat_model(model, models_dir).directory
    except ModelSourceError as error:
        raise CannotRunError(str(error)) from error
    workload = SMOKE_WORKLOAD if smoke else WORKLOAD
    rows = []
    for threads in threads_modes:
        idle: dict | None = None
        for neighbour in neighbours:
            label = f"{model} threads={threads} neighbour={neighbour}"
            logger.info("measuring %s", label)
            row: dict = {"threads": threads, "neighbour": neighbour}
            try:
                row |= run_in_fresh_process(
                    "bench.shared_cores",
                    {
                        "model_dir": str(model_dir),
                        "threads": threads,
                        "neighbour": neighbour,
                        "workload": asdict(workload),
                        "neighbour_alone_s": 1.0 if smoke else NEIGHBOUR_ALONE_S,
                    },
                    label=label,
                )
            except CannotRunError as error:
                row["error"] = str(error)
            if neighbour == "none" and "error" not in row:
                idle = row
            elif idle is not None and "error" not in row:
                for key in ("decode_tok_s", "concurrent_tok_s"):
                    row[f"{key}_of_idle"] = rounded(row[key] / idle[key], 3)
            rows.append(row)
    return {
        "config": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "model": model,
            "workload": asdict(workload),
        },
        "results": rows,
    }


def format_table(report: dict) -> str:
    config = report["config"]
    concurrency = config["workload"]["concurrency"][0]
    lines = [
        f"Chat next to another process on {config['cpu']} ({config['cores']} cores), "
        f"{config['model']}: tok/s (share of the same threads' idle figure); the neighbour's "
        "rate alone -> while the chat ran (ingestion: passages/s, busy: 512x512 matmuls/s)",
        "",
        f"| threads | neighbour | single-stream tok/s | {concurrency} concurrent tok/s "
        "| engine threads at end | neighbour alone -> with chat |",
        "|---|---|---:|---:|---:|---|",
    ]
    for row in report["results"]:
        if "error" in row:
            lines.append(f"| {row['threads']} | {row['neighbour']} | error: {row['error']} |||")
            continue

        def share(key: str, row: dict = row) -> str:
            of_idle = row.get(f"{key}_of_idle")
            return f"{row[key]:.1f}" + ("" if of_idle is None else f" ({of_idle:.0%})")

        neighbour = (
            ""
            if row["neighbour_alone_per_s"] is None
            else f"{row['neighbour_alone_per_s']} -> {row['neighbour_with_chat_per_s']}"
        )
        lines.append(
            f"| {row['threads']} | {row['neighbour']} | {share('decode_tok_s')} | "
            f"{share('concurrent_tok_s')} | {row['threads_at_end']} of {row['max_threads']} "
            f"| {neighbour} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.shared_cores", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.add_argument("--model", default=BUNDLED_CHAT_MODEL, help="default: the bundled one")
    parser.add_argument("--models-dir", type=Path, default=None, help="default: the data dir's")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, adaptive only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--neighbour", choices=NEIGHBOURS[1:], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.neighbour:
        run_neighbour(args.neighbour)
        return 0
    if args.child:
        logging.basicConfig(level=logging.WARNING)
        report_to_parent(measure(child_arguments(args.child)))
        return 0
    models_dir = args.models_dir or default_models_dir()

    def run() -> dict:
        return run_benchmark(
            model=args.model,
            models_dir=models_dir,
            threads_modes=THREADS[:1] if args.smoke else THREADS,
            neighbours=("none", "ingestion") if args.smoke else NEIGHBOURS,
            smoke=args.smoke,
        )

    return run_cli(run, as_json=args.json, format_report=format_table)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
