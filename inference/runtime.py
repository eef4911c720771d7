"""The one engine of this server process: started with the ASGI app, reloaded on activation.

Django code gets the engine with `get_engine()`. Loading runs in a background thread so the
server answers at once (health says "loading" until the model is ready). Activating another
configuration builds the new engine first, then swaps it in; requests already running finish on
the old engine, which is shut down once idle (or after a grace period, ending what is left with
finish reason "abort").
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError

from inference.engine import Engine, EngineConfig
from inference.model_files import resolve_chat_model
from inference.models import ModelConfig

logger = logging.getLogger(__name__)

DRAIN_GRACE_S = 120.0
DRAIN_POLL_S = 0.2
# A request takes the engine, then builds its prompt and queues on it (a thread hop, the start of
# its response): an old engine is not shut down as idle before this long after the swap, so such a
# request, which took it just before, still runs on it instead of failing.
DRAIN_SETTLE_S = 2.0


class EngineUnavailable(RuntimeError):
    """No engine can take requests right now (loading, or the last load failed)."""


@dataclass(slots=True)
class EngineState:
    engine: Engine | None = None
    config_name: str = ""
    model_name: str = ""  # what the engine serves, as users and API clients name it
    status: str = "not_started"  # not_started, loading, ready, error
    error: str = ""
    generation: int = 0  # bumps on every (re)load request, so a stale load never wins


_state = EngineState()
_lock = threading.Lock()


def engine_config_for(model_config: ModelConfig | None) -> EngineConfig:
    """The engine settings for a configuration (None: the defaults, with CACHET_KV_CACHE_MB).

    Also fetches a catalogue model and converts a GGUF source the first time
    (`resolve_chat_model`).
    """
    config = model_config or ModelConfig(name="default", kv_cache_mb=settings.CACHET_KV_CACHE_MB)
    resolved = resolve_chat_model(
        config.effective_source, settings.MODELS_DIR, model_cache=settings.CACHET_MODEL_CACHE
    )
    draft_dir, draft_source = None, config.draft_source.strip()
    if config.uses_draft_model and draft_source:
        draft_dir = resolve_chat_model(
            draft_source, settings.MODELS_DIR, model_cache=settings.CACHET_MODEL_CACHE
        ).directory
    return config.engine_config(resolved.directory, draft_model_dir=draft_dir)


def served_model_name(model_config: ModelConfig | None) -> str:
    """The served model's name: its configured source (a catalogue name, a hub id or a path)."""
    source = model_config.effective_source if model_config else settings.CACHET_MODEL
    return source.rstrip("/")


def start_engine(*, wait: bool = False) -> None:
    """Load the active configuration's engine unless one is loaded or loading."""
    try:
        active = ModelConfig.active()
    except DatabaseError as error:
        # NOTE: an unmigrated database must not keep the server from serving the default model.
        logger.warning("no model configuration read (%s); using the defaults", error)
        active = None
    with _lock:
        is_started = _state.status in {"loading", "ready"}
        thread = None if is_started else _begin_load(active)
    if thread is not None and wait:
        thread.join()


def reload_engine(model_config: ModelConfig, *, wait: bool = False) -> None:
    """Load `model_config` in the background and swap it in when ready."""
    with _lock:
        thread = _begin_load(model_config)
    if wait:
        thread.join()


def _begin_load(model_config: ModelConfig | None) -> threading.Thread:
    _state.generation += 1
    generation = _state.generation
    if _state.engine is None:
        _state.status = "loading"
    name = model_config.name if model_config else "default"
    thread = threading.Thread(
        target=_load, args=(model_config, name, generation), name=f"engine-load-{name}", daemon=True
    )
    thread.start()
    return thread


def _load(model_config: ModelConfig | None, name: str, generation: int) -> None:
    started = time.perf_counter()
    try:
        engine = Engine(engine_config_for(model_config))
    except Exception as error:  # report every load failure; the previous engine keeps serving
        logger.exception("loading engine %r failed", name)
        with _lock:
            if generation == _state.generation:
                _state.error = f"loading {name!r} failed: {error}"
                if _state.engine is None:
                    _state.status = "error"
        return
    with _lock:
        if generation != _state.generation:
            stale, old = engine, None  # a newer reload was requested meanwhile
        else:
            stale, old = None, _state.engine
            _state.engine, _state.config_name, _state.status, _state.error = (
                engine,
                name,
                "ready",
                "",
            )
            _state.model_name = served_model_name(model_config)
    if stale is not None:
        stale.shutdown()
        return
    logger.info("engine %r ready in %.1fs", name, time.perf_counter() - started)
    if old is not None:
        threading.Thread(target=_drain, args=(old,), name="engine-drain", daemon=True).start()


def _drain(engine: Engine, grace_s: float = DRAIN_GRACE_S) -> None:
    time.sleep(min(DRAIN_SETTLE_S, grace_s))
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and engine.has_unfinished_requests():
        time.sleep(DRAIN_POLL_S)
    # NOTE: whatever still runs after the grace period ends with finish_reason "abort".
    engine.shutdown()


def get_engine_and_model() -> tuple[Engine, str]:
    """The engine with the name of the model it serves (read together, so they agree)."""
    engine = get_engine()
    with _lock:
        return engine, _state.model_name if _state.engine is engine else ""


def get_engine() -> Engine:
    with _lock:
        engine, status, error = _state.engine, _state.status, _state.error
    if engine is not None:
        return engine
    if status == "loading":
        raise EngineUnavailable("the model is still loading; try again in a few seconds")
    if status == "error":
        raise EngineUnavailable(f"the model could not be loaded: {error}")
    raise EngineUnavailable("the engine is not started in this process")


def engine_status() -> dict[str, str]:
    with _lock:
        return {
            "status": _state.status,
            "config": _state.config_name,
            "model": _state.model_name,
            "error": _state.error,
        }


def stop_engine() -> None:
    """Shut the engine down (tests and process exit)."""
    with _lock:
        engine, _state.engine = _state.engine, None
        _state.status, _state.config_name, _state.error = "not_started", "", ""
        _state.model_name = ""
        _state.generation += 1
    if engine is not None:
        engine.shutdown()
