"""One measurement in a fresh Python process, for benchmarks that compare configurations.

Why: a process keeps what an earlier configuration left behind (loaded kernels, the allocator's
pages, torch's thread pool, a model's memory), which skews the next one's speed and peak memory.
The parent runs `python -m <module> --child <file>` with the measurement's arguments in a JSON
file; the child measures, then prints one line `RESULT_MARKER <json>` that the parent reads back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import CannotRunError

RESULT_MARKER = "cachet-bench-result: "


def run_in_fresh_process(
    module: str, arguments: dict[str, Any], *, label: str, environment: dict[str, str] | None = None
) -> dict[str, Any]:
    """The result `module`'s child printed for `arguments` (run with `environment` added to
    this process's). Raises CannotRunError, with the child's error output, when it printed none.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="cachet-bench-") as handle:
        json.dump(arguments, handle)
        handle.flush()
        done = subprocess.run(
            [sys.executable, "-m", module, "--child", handle.name],
            capture_output=True,
            text=True,
            check=False,
            env=os.environ | (environment or {}),
        )
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            result: dict[str, Any] = json.loads(line.removeprefix(RESULT_MARKER))
            return result
    raise CannotRunError(
        f"measuring {label} failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
    )


def child_arguments(arguments_file: str) -> dict[str, Any]:
    """The arguments the parent wrote for this child."""
    arguments: dict[str, Any] = json.loads(Path(arguments_file).read_text())
    return arguments


def report_to_parent(result: dict[str, Any]) -> None:
    """Hand `result` back to the parent (the child's last act)."""
    sys.stdout.write(f"{RESULT_MARKER}{json.dumps(result)}\n")
    sys.stdout.flush()
