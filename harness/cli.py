"""The command line of a benchmark or a reliability suite: run it, print its report, exit status.

`run_cli` is the one place that decides the exit status every command shares (0 done, 1 done but
requests or checks failed, 2 it could not run, 130 interrupted); `rounded` and `counts` shape the
numbers of a JSON report.
"""

from __future__ import annotations

import json
import logging
import platform
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType

logger = logging.getLogger(__name__)


class CannotRunError(RuntimeError):
    """The run could not go on (the server did not start, setting up the site failed...)."""


def chat_model_dir(model: str, models_dir: Path) -> Path:
    """The prepared directory of the chat model `model` (a catalogue name, a Hugging Face id or
    a directory) in `models_dir`; CannotRunError naming the model where it cannot be had."""
    from inference.model_files import ModelSourceError, resolve_chat_model

    try:
        return resolve_chat_model(model, models_dir).directory
    except ModelSourceError as error:
        raise CannotRunError(f"model {model}: {error}") from None


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


def cpu_name() -> str:
    """The processor's model name, written next to every figure a benchmark reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def counts(values: Iterable[object]) -> dict[str, int]:
    """How often each value occurs, keyed by its string (finish reasons, for the report)."""
    found: dict[str, int] = {}
    for value in values:
        found[str(value)] = found.get(str(value), 0) + 1
    return found


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def rows_with_errors(report: dict) -> int:
    """How many of a report's result rows carry an "error" (a configuration that could not run
    keeps its row, with the reason)."""
    return sum("error" in row for row in report["results"])


def run_cli(
    run: Callable[[], dict],
    *,
    as_json: bool,
    format_report: Callable[[dict], str],
    num_errors: Callable[[dict], int] = rows_with_errors,
) -> int:
    """Run a command and print its report (JSON or a table); the exit status.

    0: done, 1: done but requests failed, 2: it could not run (`CannotRunError`), 130: interrupted
    (SIGTERM too, so `kill` still stops the command's server).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        report = run()
    except CannotRunError as error:
        logger.error("%s", error)
        return 2
    except KeyboardInterrupt:
        logger.error("interrupted; the server was stopped")
        return 130
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_report(report) + "\n")
    return 1 if num_errors(report) else 0
