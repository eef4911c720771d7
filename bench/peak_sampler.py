"""The peak of a reading while a phase of a benchmark runs (memory, KV cache usage)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil


@dataclass(slots=True)
class PeakSampler:
    """Samples `read()` in a thread while a phase runs and keeps the largest value."""

    read: Callable[[], float]
    interval_s: float = 0.05
    peak: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PeakSampler:
        def sample() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, self.read())
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def peak_rss() -> PeakSampler:
    """This process's peak resident memory in bytes, as `.peak`."""
    process = psutil.Process()
    return PeakSampler(lambda: process.memory_info().rss)


def mb(num_bytes: float) -> float:
    return round(num_bytes / 2**20, 1)
