"""Attention over the paged KV cache: the step's index tensors (metadata.py), then the attention
itself (paged.py)."""

from inference.engine.layers.attention.metadata import (
    CASCADE_MIN_SHARED_TOKENS,
    AttentionMetadata,
    PrefillSpan,
    build_attention_metadata,
)
from inference.engine.layers.attention.paged import paged_attention

__all__ = [
    "CASCADE_MIN_SHARED_TOKENS",
    "AttentionMetadata",
    "PrefillSpan",
    "build_attention_metadata",
    "paged_attention",
]
