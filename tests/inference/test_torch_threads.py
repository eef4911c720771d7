"""Torch work off the engine thread: single-threaded here, or on a thread that goes away."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from inference.torch_threads import (
    BACKGROUND_NICENESS,
    run_on_short_lived_thread,
    run_single_threaded,
    run_torch_work,
)


def where_and_how_many() -> tuple[int, int]:
    return threading.get_ident(), torch.get_num_threads()


def run_in_fresh_thread(work):
    """The setting is per thread: keep the test runner's own thread untouched."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=work()))
    thread.start()
    thread.join()
    return result["value"]


def test_single_threaded_work_runs_here_with_torch_threads_on_free_cores():
    caller, (ident, num_threads) = run_in_fresh_thread(
        lambda: (threading.get_ident(), run_single_threaded(where_and_how_many))
    )
    assert (ident, num_threads) == (caller, 1)


def test_single_threaded_work_leaves_the_callers_setting_as_it_was():
    def run_then_read():
        torch.set_num_threads(2)
        run_single_threaded(where_and_how_many)
        return torch.get_num_threads()

    assert run_in_fresh_thread(run_then_read) == 2


def test_short_lived_thread_work_runs_elsewhere_and_returns_its_value():
    ident, num_threads = run_on_short_lived_thread(where_and_how_many, num_threads=2)
    assert ident != threading.get_ident()
    assert num_threads == 2


def test_short_lived_thread_errors_reach_the_caller():
    def fail():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        run_on_short_lived_thread(fail)


def test_small_batches_stay_on_the_caller_and_large_ones_move():
    caller, (small_ident, small_threads) = run_in_fresh_thread(
        lambda: (threading.get_ident(), run_torch_work(where_and_how_many, batch_size=4))
    )
    assert (small_ident, small_threads) == (caller, 1)
    large_ident, _ = run_torch_work(where_and_how_many, batch_size=64)
    assert large_ident != threading.get_ident()


def this_threads_niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_background_work_runs_niced_and_leaves_the_callers_priority_alone():
    caller = this_threads_niceness()
    assert run_torch_work(this_threads_niceness, batch_size=64, background=True) == max(
        caller, BACKGROUND_NICENESS
    )
    assert run_torch_work(this_threads_niceness, batch_size=64) == caller
    # small batches stay on the caller's thread, at its priority (query latency)
    assert run_torch_work(this_threads_niceness, batch_size=4, background=True) == caller
    assert this_threads_niceness() == caller
