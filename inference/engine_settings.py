"""Engine settings on the Django side: `EngineConfig` is their one list, defaults included.

An engine's settings come from three places, joined in `ModelConfig.engine_config()` only: the
model configuration's engine fields, named as in `EngineConfig` (inference/models.py); the
process-wide ones, the same for every configuration (`PROCESS_SETTINGS`, read from the
environment in chatsite/settings.py); and the model directory. Every other knob keeps
`EngineConfig`'s default, which the app reads with `engine_default` instead of restating it.

No models here: chatsite/settings.py imports this module before the apps are loaded.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings

from inference.engine import EngineConfig

# The EngineConfig fields set for the whole process, with the setting (environment variable)
# that sets each: they depend on the machine and the server, not on the model configuration.
PROCESS_SETTINGS: dict[str, str] = {
    "num_threads": "CACHET_TORCH_THREADS",
    "adaptive_threads": "CACHET_ADAPTIVE_THREADS",
    "native_kernels": "CACHET_NATIVE_KERNELS",
    "fused_decode": "CACHET_FUSED_DECODE",
    "kv_disk_cache_dir": "CACHET_KV_DISK_CACHE_DIR",
    "kv_disk_cache_mb": "CACHET_KV_DISK_CACHE_MB",
    "chunk_kv_reuse": "CACHET_CHUNK_KV_REUSE",
    "chunk_kv_recompute_tokens": "CACHET_CHUNK_KV_RECOMPUTE_TOKENS",
    "chunk_kv_selection": "CACHET_CHUNK_KV_SELECTION",
    "prefill_weights": "CACHET_PREFILL_WEIGHTS",
    "prefill_attention": "CACHET_PREFILL_ATTENTION",
    "device": "CACHET_DEVICE",
}

_ENGINE_FIELDS = {field.name: field for field in dataclasses.fields(EngineConfig)}


def engine_default(name: str) -> Any:
    """`EngineConfig`'s default for the setting `name` (KeyError: no such setting)."""
    default = _ENGINE_FIELDS[name].default
    if default is dataclasses.MISSING:
        raise KeyError(f"EngineConfig.{name} has no default")
    return default


def process_engine_settings() -> dict[str, Any]:
    """The process-wide engine settings by `EngineConfig` name, from chatsite/settings.py."""
    return {name: getattr(settings, variable) for name, variable in PROCESS_SETTINGS.items()}
