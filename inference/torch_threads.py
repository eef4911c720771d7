"""Running torch work off the engine thread without slowing the engine down.

NOTE: libgomp keeps one OpenMP team per thread that ever ran a parallel region, for as long as
that thread lives. Once a process holds more pooled OpenMP threads than cores, libgomp throttles
every team's spin-wait, and each of the engine's ~400 parallel regions per decode step then pays
a futex wake-up (measured on 2 cores: 20 -> 28 ms per step). So work outside the engine thread
either runs single-threaded (no team at all: small query batches, where one thread is as fast)
or on a short-lived thread whose team goes away with it (ingestion batches).

Bulk work (ingestion's embeddings) runs `background`: its thread, and so the OpenMP team it
starts, at a lower CPU priority (nice BACKGROUND_NICENESS, Linux's per-thread niceness). The
scheduler then gives the engine's threads the cores first, and the engine does not count niced
time as cores taken from it (inference/engine/core_share.py): a chat stays fast while a document
ingests, and the ingestion uses whatever the engine leaves.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)

BACKGROUND_NICENESS = 10  # CFS weight 110 against the engine's 1024: ~10% of a contended core


def lower_this_threads_priority(niceness: int = BACKGROUND_NICENESS) -> None:
    """Nice the calling thread (only it, and threads it starts from now on) to `niceness`."""
    try:
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        if current < niceness:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (AttributeError, OSError) as error:  # not Linux / not permitted: run at its priority
        logger.debug("could not lower the thread's priority: %s", error)


def run_single_threaded(work: Callable[[], T]) -> T:
    """Run `work` on this thread with one torch thread; the thread's own setting is restored.

    (The setting is per thread, and restoring it creates no OpenMP team: that happens only at
    the next parallel region.)
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return work()
    finally:
        torch.set_num_threads(previous)


def run_on_short_lived_thread(
    work: Callable[[], T], num_threads: int = 0, *, background: bool = False
) -> T:
    """Run `work` on a fresh thread (`num_threads` torch threads, 0: one per core) and wait;
    `background`: at a lower CPU priority (see the module docstring).

    Exceptions propagate to the caller.
    """
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            if background:
                lower_this_threads_priority()
            if num_threads:
                import torch

                torch.set_num_threads(num_threads)
            outcome["value"] = work()
        except BaseException as error:  # re-raised on the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=target, name="cachet-torch-batch", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def run_torch_work(
    work: Callable[[], T], batch_size: int, *, small_batch: int = 8, background: bool = False
) -> T:
    """Small batches single-threaded here; larger ones multi-threaded on a short-lived thread,
    at a lower priority if they are `background` work."""
    if batch_size <= small_batch:
        return run_single_threaded(work)
    return run_on_short_lived_thread(work, background=background)
