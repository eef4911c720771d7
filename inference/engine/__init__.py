"""The inference engine: no Django imports anywhere below this package.

This module is the engine's front door: code outside `inference/engine/` imports only the names
below. Inside, `core/` is the torch-free bookkeeping (sequences, blocks, scheduling, speculation,
detokenizing), `layers/` the torch modules and PyTorch paths, `models/` one file per architecture
and `kernels/` the native CPU kernels, one module per C source.
"""

from inference.engine.config import (
    CHUNK_KV_SELECTIONS,
    MAX_SPECULATIVE_TOKENS,
    PREFILL_ATTENTION,
    PREFILL_WEIGHTS,
    ConfigError,
    EngineConfig,
    parse_dtype,
    resolve_device,
)
from inference.engine.core.reusable_spans import ReusableSpans
from inference.engine.core.sampling_params import SamplingParams
from inference.engine.core.structured_output import StructuredOutput, StructuredOutputError
from inference.engine.draft_vocabulary import check_draft_vocabulary
from inference.engine.engine import Engine
from inference.engine.kv_cache import KVCacheSpec
from inference.engine.layers.quantization import (
    DEFAULT_INT4_GROUP_SIZE,
    check_quantization,
    model_weight_bytes,
)
from inference.engine.model_runner import BatchEntry, ModelRunner
from inference.engine.models.registry import SUPPORTED_MODEL_TYPES
from inference.engine.outputs import (
    Delta,
    EngineClosedError,
    GenerationResult,
    PromptTooLongError,
    RequestFailedError,
    TokenLogprob,
    Usage,
)

__all__ = [
    "CHUNK_KV_SELECTIONS",
    "DEFAULT_INT4_GROUP_SIZE",
    "MAX_SPECULATIVE_TOKENS",
    "PREFILL_ATTENTION",
    "PREFILL_WEIGHTS",
    "SUPPORTED_MODEL_TYPES",
    "BatchEntry",
    "ConfigError",
    "Delta",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "GenerationResult",
    "KVCacheSpec",
    "ModelRunner",
    "PromptTooLongError",
    "RequestFailedError",
    "ReusableSpans",
    "SamplingParams",
    "StructuredOutput",
    "StructuredOutputError",
    "TokenLogprob",
    "Usage",
    "check_draft_vocabulary",
    "check_quantization",
    "model_weight_bytes",
    "parse_dtype",
    "resolve_device",
]
