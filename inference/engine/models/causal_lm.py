"""What every architecture defines and the rest of the engine relies on.

`DecoderArgs` is the shape of a decoder as the loader, the KV cache, the runner and the kernels
read it; each architecture's args extend it with what only its layers read. `CausalLM` is the
model's interface: forward over a flat token batch with the paged KV cache, then the logits.
Parameter names are transformers' without the `model.` prefix, except the fused
`self_attn.qkv_proj` and `mlp.gate_up_proj` (the loader maps checkpoints onto them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.kv_cache import LayerKVCache
from inference.engine.layers.attention import AttentionMetadata

FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"  # config.layer_types


class FusedLayers(Protocol):
    """All decoder layers of a decode step in one call (kernels.decode_layers.FusedDecode).

    NOTE: a protocol, so the model does not import the kernel that imports the model.
    """

    # whether decodes sharing leading blocks attend them apart, once for all (cascade)
    cascades: bool

    def takes(self, num_decodes: int) -> bool: ...

    def applies_to(
        self, metadata: AttentionMetadata, kv_caches: list[LayerKVCache], num_tokens: int
    ) -> bool: ...

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(slots=True)
class DecoderArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    # Per layer: how many positions a query attends back (itself included) on a sliding-window
    # layer, None on a global one. Empty: every layer is global.
    sliding_windows: tuple[int | None, ...] = ()
    # logits become cap * tanh(logits / cap) (Gemma), None: no cap
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        if not self.sliding_windows:
            self.sliding_windows = (None,) * self.num_layers
        if len(self.sliding_windows) != self.num_layers:
            raise ValueError(
                f"{len(self.sliding_windows)} sliding windows given for {self.num_layers} layers"
            )
        if any(w is not None and w < 1 for w in self.sliding_windows):
            raise ValueError(f"sliding windows must be >= 1, got {self.sliding_windows}")

    @property
    def distinct_sliding_windows(self) -> tuple[int, ...]:
        """The window sizes the layers use, each once (empty when every layer is global)."""
        return tuple(sorted({w for w in self.sliding_windows if w is not None}))


def sliding_windows_of(layer_types: Sequence[str], window: int | None) -> tuple[int | None, ...]:
    """Each layer's sliding window from transformers' `layer_types` and `sliding_window`
    (a config without a window has global layers only, whatever their types say)."""
    unknown = set(layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION}
    if unknown:
        raise ValueError(
            f"config layer_types name {sorted(unknown)}; the engine knows "
            f"{FULL_ATTENTION!r} and {SLIDING_ATTENTION!r}"
        )
    if not window:
        return (None,) * len(layer_types)
    return tuple(int(window) if kind == SLIDING_ATTENTION else None for kind in layer_types)


class CausalLM(nn.Module):
    """A decoder-only language model over a flat batch of tokens (see model_runner.py)."""

    args: DecoderArgs
    embed_tokens: nn.Module
    # None for tied embeddings: the logits read `embed_tokens.weight` (until quantization or
    # packing puts the shared table here, see layers/quantization.py and layers/linear.py).
    lm_head: nn.Module | None
    # Set by ModelRunner where all layers can run a decode step in one native call
    # (kernels/decode_layers.py); None: the layers run one by one.
    fused_decode: FusedLayers | None = None

    @classmethod
    def read_args(cls, hf_config: Any) -> DecoderArgs:
        """This architecture's args from a transformers config (ValueError when unsupported)."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        kv_caches: list[LayerKVCache],
    ) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] after the final norm, for a flat token batch."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            table = self.embed_tokens.weight
            if not isinstance(table, torch.Tensor):
                raise TypeError("a tied model's embed_tokens has no weight table")
            logits = F.linear(hidden, table)
        else:
            # NOTE: a module call, not its .weight: quantization swaps in its own linear here
            # (for tied models, the quantized embedding table; see quantization.py).
            logits = self.lm_head(hidden)
        cap = self.args.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits
