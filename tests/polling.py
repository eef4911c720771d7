"""`wait_until`: poll a condition that another thread or process makes true."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """Return once `predicate()` is truthy; fail naming `what` after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
