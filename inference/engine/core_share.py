"""How many threads the engine's next step should use, given what other processes take.

Every native kernel and PyTorch op of a step is an OpenMP parallel region, and a region ends
when its slowest thread does. When another process keeps a core busy, one of the engine's
threads is descheduled for a scheduler slice (milliseconds) at nearly every region, and a
decode step of ~400 regions collapses (measured on 2 cores while a second process embedded
documents: 41.3 -> 5.7 tok/s single stream, 7x, where losing a core should cost 2x). With one
thread fewer than the busy cores leave, the step runs on what it really has.

`CoreShare` watches the machine's CPU time (Linux's /proc/stat) minus this process's own
(/proc/self/stat) over the last `window_s`: what the rest of the machine used. Niced processes
(nice > 0: /proc/stat's "nice" column, e.g. Cachet's own ingestion, inference/torch_threads.py)
are not counted, because the scheduler gives the engine's threads the core before them anyway.
Elsewhere (no /proc) it always answers the configured count.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

WINDOW_S = 0.5  # how far back the rest of the machine's use is averaged
# a core counts as taken when others use more than this share of it (a shell, a log writer or
# the web server's event loop use a few percent and must not cost the engine a thread)
BUSY_SHARE = 0.5


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative CPU time in clock ticks: all cores' non-idle time not spent by niced
    processes, all cores' total, and this process's own."""

    busy_unniced: int
    total: int
    own: int


def read_cpu_times(proc: Path = Path("/proc")) -> CpuTimes | None:
    """The machine's and this process's CPU times now, or None where /proc does not have them."""
    try:
        fields = (proc / "stat").read_text().split("\n", 1)[0].split()
        own_fields = (proc / "self" / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "cpu" or len(fields) < 5:
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    ticks = [int(value) for value in fields[1:9]]
    total = sum(ticks)
    nice, idle = ticks[1], ticks[3]
    iowait = ticks[4] if len(ticks) > 4 else 0
    # /proc/self/stat after the command name: state is field 3, utime and stime fields 14, 15
    own = int(own_fields[11]) + int(own_fields[12])
    return CpuTimes(busy_unniced=total - idle - iowait - nice, total=total, own=own)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, so containers pinned to fewer
    cores than the machine has count right)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


class CoreShare:
    """`threads()`: the configured count, less one per core the rest of the machine keeps busy
    (at least one). Re-measured at most every `window_s`; cheap to call every step."""

    def __init__(
        self,
        max_threads: int,
        *,
        window_s: float = WINDOW_S,
        read_times: Callable[[], CpuTimes | None] = read_cpu_times,
        clock: Callable[[], float] = time.monotonic,
        num_cores: int | None = None,
        machine_cores: int | None = None,
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.num_cores = usable_cores() if num_cores is None else num_cores
        # NOTE: /proc/stat's totals count every core of the machine, usable by us or not
        self.machine_cores = (
            (os.cpu_count() or self.num_cores) if machine_cores is None else machine_cores
        )
        self._window_s, self._read_times, self._clock = window_s, read_times, clock
        self._last = read_times()
        self._last_at = clock()
        self._threads = self.max_threads
        self.others_busy_cores = 0.0

    @property
    def current_threads(self) -> int:
        """The last answer of `threads()` (safe to read from any thread)."""
        return self._threads

    def threads(self) -> int:
        now = self._clock()
        if self._last is None or now - self._last_at < self._window_s:
            return self._threads
        times = self._read_times()
        if times is None:
            return self._threads
        elapsed_total = times.total - self._last.total
        if elapsed_total > 0:
            window_ticks = elapsed_total / self.machine_cores  # the window's length in ticks
            others = (times.busy_unniced - self._last.busy_unniced) - (times.own - self._last.own)
            self.others_busy_cores = max(0.0, others / window_ticks)
            taken = math.floor(self.others_busy_cores + 1 - BUSY_SHARE)
            threads = max(1, min(self.max_threads, self.num_cores - taken))
            if threads != self._threads:
                logger.info(
                    "other processes keep %.1f cores busy: the engine runs %d threads (was %d)",
                    self.others_busy_cores,
                    threads,
                    self._threads,
                )
                self._threads = threads
        self._last, self._last_at = times, now
        return self._threads
