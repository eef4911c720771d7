"""The last hour of this process's metrics, sampled every few seconds, for the staff dashboard.

A daemon thread (started with the engine, chatsite/asgi.py) reads the engine's and the backends'
registries every CACHET_DASHBOARD_SAMPLE_S seconds into ring buffers: one per model the engine
served (a reload to another model starts another series), one for the backends' turn counts.
Memory is bounded: an hour of readings per series, at most MAX_MODEL_SERIES models.

NOTE: kept in this process's memory, not in the database or Redis, because what it samples is
per process too: each server process runs its own engine with its own counters (as `/metrics`
serves them). With several web processes each dashboard shows its own process (the page says
which); a scraper of every process's `/metrics` (Prometheus) is the fleet-wide view.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque

from django.conf import settings

from backends import metrics as backend_metrics
from inference import runtime
from inference.metrics_samples import BackendReading, EngineReading, read_backends, read_engine

logger = logging.getLogger(__name__)

WINDOW_S = 3600.0
MAX_MODEL_SERIES = 4


class MetricsHistory:
    """Ring buffers of readings, safe to read from request threads while the sampler appends."""

    def __init__(self, interval_s: float, window_s: float = WINDOW_S):
        self.interval_s = interval_s
        self.window_s = window_s
        self.max_readings = math.ceil(window_s / interval_s) + 1
        self._models: OrderedDict[str, deque[EngineReading]] = OrderedDict()
        self._backends: deque[BackendReading] = deque(maxlen=self.max_readings)
        self._lock = threading.Lock()

    def add(self, engine: EngineReading | None, backends: BackendReading) -> None:
        with self._lock:
            if engine is not None:
                series = self._models.pop(engine.model, None)
                if series is None:
                    series = deque(maxlen=self.max_readings)
                self._models[engine.model] = series  # most recently sampled last
                series.append(engine)
                while len(self._models) > MAX_MODEL_SERIES:
                    self._models.popitem(last=False)
            self._backends.append(backends)

    def models(self) -> dict[str, list[EngineReading]]:
        """Each model's readings, oldest first (copies)."""
        with self._lock:
            return {model: list(series) for model, series in self._models.items()}

    def backends(self) -> list[BackendReading]:
        with self._lock:
            return list(self._backends)


def read_now() -> tuple[EngineReading | None, BackendReading]:
    """The current values (the engine's None while it loads or failed)."""
    now = time.time()
    backends = read_backends(backend_metrics.REGISTRY, time=now)
    try:
        engine, model = runtime.get_engine_and_model()
    except runtime.EngineUnavailable:
        return None, backends
    reading = read_engine(engine.metrics.registry, time=now, model=model, engine_id=id(engine))
    return reading, backends


def _sample_forever(history: MetricsHistory) -> None:
    """The sampler thread: a reading every `history.interval_s` seconds, for the process's life."""
    while True:
        try:
            history.add(*read_now())
        except Exception:  # a failed reading must not end the dashboard's history
            logger.exception("reading the metrics for the dashboard failed")
        time.sleep(history.interval_s)


_history: MetricsHistory | None = None
_start_lock = threading.Lock()


def start_sampler() -> MetricsHistory:
    """Start this process's sampler once; its history."""
    global _history
    with _start_lock:
        if _history is None:
            _history = MetricsHistory(float(settings.CACHET_DASHBOARD_SAMPLE_S))
            threading.Thread(
                target=_sample_forever, args=(_history,), name="metrics-sampler", daemon=True
            ).start()
        return _history


def process_history() -> MetricsHistory | None:
    """The history of this process (None where no sampler runs: no engine started here)."""
    return _history
