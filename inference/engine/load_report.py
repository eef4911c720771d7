"""What loading a model cost: seconds, peak memory, weight bytes against the checkpoint's.

`LoadReport` travels with the loaded model (loader.LoadedModel, ModelRunner.load_report) so
benchmarks can print it, and is logged once per load.

Peak memory is the process's peak resident set during the load: Linux lets a process reset its
own high-water mark (`/proc/self/clear_refs`, "5"), so the peak is the load's own, not one left
by earlier work. Elsewhere it is the process's lifetime peak (`resource.getrusage`), which can
only overstate the load's.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass(frozen=True, slots=True)
class LoadReport:
    source: str  # the checkpoint: a GGUF file or a model directory
    checkpoint_format: str  # "gguf" or "safetensors"
    seconds: float
    peak_rss_bytes: int
    weight_bytes: int  # of the model as loaded (model_weight_bytes)
    checkpoint_bytes: int  # of the checkpoint's tensors as stored
    # engine weight format -> how many weight matrices (and tables) load in it
    formats: dict[str, int] = field(default_factory=dict)

    @property
    def weight_ratio(self) -> float:
        """Loaded weight bytes over the checkpoint's (1.0: the same size)."""
        return self.weight_bytes / self.checkpoint_bytes if self.checkpoint_bytes else 0.0

    def describe(self) -> str:
        formats = ", ".join(f"{count} {name}" for name, count in sorted(self.formats.items()))
        return (
            f"{self.source} ({self.checkpoint_format}): {self.weight_bytes / 2**20:.1f} MiB of "
            f"weights from {self.checkpoint_bytes / 2**20:.1f} MiB of tensors "
            f"({self.weight_ratio:.2f}x){f'; {formats}' if formats else ''}, "
            f"in {self.seconds:.1f} s, peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB"
        )


class LoadMeter:
    """Started before a load, `finish(...)` after it: the LoadReport of what happened between."""

    def __init__(self) -> None:
        _reset_peak_rss()
        self._started = time.perf_counter()

    def finish(
        self,
        source: str | Path,
        checkpoint_format: str,
        *,
        weight_bytes: int,
        checkpoint_bytes: int,
        formats: dict[str, int] | None = None,
    ) -> LoadReport:
        report = LoadReport(
            source=str(source),
            checkpoint_format=checkpoint_format,
            seconds=time.perf_counter() - self._started,
            peak_rss_bytes=_peak_rss_bytes(),
            weight_bytes=weight_bytes,
            checkpoint_bytes=checkpoint_bytes,
            formats=dict(formats or {}),
        )
        logger.info("loaded %s", report.describe())
        return report


def _reset_peak_rss() -> None:
    # NOTE: not Linux, or not allowed: the report gives the lifetime peak instead.
    with contextlib.suppress(OSError):
        _CLEAR_REFS.write_text("5")


def _peak_rss_bytes() -> int:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # NOTE: kilobytes on Linux, bytes on macOS.
    return peak if sys.platform == "darwin" else peak * 1024
