"""Whether an engine is idle again (no running request, no KV block in use), and waiting for it."""

from __future__ import annotations

import asyncio
import time

from inference.engine import Engine


def kv_is_idle(engine: Engine) -> bool:
    snapshot = engine.metrics.snapshot()
    return snapshot["kv_usage"] == 0 and snapshot["num_running"] == 0


async def wait_for_idle_kv(engine: Engine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not kv_is_idle(engine):
        if time.monotonic() > deadline:
            raise AssertionError(f"KV cache not idle: {engine.metrics.snapshot()}")
        await asyncio.sleep(0.01)
