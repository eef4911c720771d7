"""The Gemma 3 text decoder over a flat batch of tokens (Gemma 3 270M to 27B, text only).

Beside the Llama family it differs in: embeddings scaled by sqrt(hidden_size) (rounded to the
model dtype first, as transformers does); RMSNorm with a (1 + weight) scale computed in float32
(layers/norm.py), four of them per layer (before and after attention and the MLP, the residual
added after the post-norms); per-head q/k norms; GeGLU (tanh GELU); attention scaled by
query_pre_attn_scalar**-0.5 instead of head_dim**-0.5; and sliding-window layers interleaved
with global ones (5 local : 1 global), the local ones with their own RoPE base. The final
logits are soft-capped when `final_logit_softcapping` is configured (Gemma 3 configures none).
NOTE: `attn_logit_softcapping` is read by nobody, as in transformers' Gemma 3 (its attention
passes no softcap: Gemma 3 replaced Gemma 2's score capping with the q/k norms).

The native kernels that assume Llama numerics (norms, fused decode) are not used; the rotary
+ KV-cache write and the linear layers are shared with the Llama family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from inference.engine.kv_cache import LayerKVCache
from inference.engine.layers.attention import AttentionMetadata
from inference.engine.layers.attention.self_attention import SelfAttention
from inference.engine.layers.mlp import GatedMLP
from inference.engine.layers.norm import GemmaRMSNorm
from inference.engine.layers.rotary import RopeArgs, RotaryEmbedding
from inference.engine.models.causal_lm import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    CausalLM,
    DecoderArgs,
    sliding_windows_of,
)

DEFAULT_GLOBAL_ROPE_THETA, DEFAULT_LOCAL_ROPE_THETA = 1_000_000.0, 10_000.0


@dataclass(slots=True)
class Gemma3Args(DecoderArgs):
    query_pre_attn_scalar: float = 256.0
    attention_bias: bool = False
    activation: str = "gelu_pytorch_tanh"
    rope_global: RopeArgs = field(default_factory=RopeArgs)
    rope_local: RopeArgs = field(default_factory=RopeArgs)

    @classmethod
    def from_hf_config(cls, config: Any) -> Gemma3Args:
        """Args from a `gemma3_text` config, or a `gemma3` one (its nested text_config)."""
        config = getattr(config, "text_config", None) or config
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError(
                "a Gemma 3 config with use_bidirectional_attention is an encoder (embedding "
                "model), not a causal language model"
            )
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} attention heads are not a multiple of {num_kv_heads}")
        activation = getattr(config, "hidden_activation", None) or config.hidden_act
        rope_global, rope_local = _rope_args(config)
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            rms_norm_eps=float(config.rms_norm_eps),
            max_position_embeddings=config.max_position_embeddings,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
            sliding_windows=sliding_windows_of(
                _layer_types(config), getattr(config, "sliding_window", None)
            ),
            final_logit_softcapping=getattr(config, "final_logit_softcapping", None),
            query_pre_attn_scalar=float(config.query_pre_attn_scalar),
            attention_bias=bool(getattr(config, "attention_bias", False)),
            activation=activation,
            rope_global=rope_global,
            rope_local=rope_local,
        )


def _rope_args(config: Any) -> tuple[RopeArgs, RopeArgs]:
    """(global layers' RoPE, sliding layers' RoPE).

    transformers 5 keeps one `rope_parameters` dict per layer type; older configs give the
    global base as `rope_theta` (with `rope_scaling`) and the local one as `rope_local_base_freq`.
    """
    params = getattr(config, "rope_parameters", None) or {}
    global_theta = getattr(config, "rope_theta", None) or DEFAULT_GLOBAL_ROPE_THETA
    local_theta = getattr(config, "rope_local_base_freq", None) or DEFAULT_LOCAL_ROPE_THETA
    if FULL_ATTENTION in params or SLIDING_ATTENTION in params:
        global_params = params.get(FULL_ATTENTION) or {}
        local_params = params.get(SLIDING_ATTENTION) or {}
    else:
        global_params = {**(getattr(config, "rope_scaling", None) or {}), **params}
        local_params = {}
    return (
        RopeArgs.from_parameters(global_params, global_theta, config),
        RopeArgs.from_parameters(local_params, local_theta, config),
    )


def _layer_types(config: Any) -> list[str]:
    """`config.layer_types`, or for older configs the ones `sliding_window_pattern` implies
    (every pattern-th layer global, as transformers derives them)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return list(layer_types)
    pattern = getattr(config, "sliding_window_pattern", None) or 6
    return [
        SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION
        for i in range(config.num_hidden_layers)
    ]


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, args: Gemma3Args, layer_index: int) -> None:
        super().__init__()
        hidden, eps = args.hidden_size, args.rms_norm_eps
        self.is_sliding = args.sliding_windows[layer_index] is not None
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.self_attn = SelfAttention(
            hidden,
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            scale=args.query_pre_attn_scalar**-0.5,
            qkv_bias=args.attention_bias,
            o_bias=args.attention_bias,
            qk_norm="gemma",
            norm_eps=eps,
            sliding_window=args.sliding_windows[layer_index],
        )
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.mlp = GatedMLP(hidden, args.intermediate_size, activation=args.activation)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: LayerKVCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, metadata)
        x = x + self.post_attention_layernorm(attended)
        fed_forward = self.mlp(self.pre_feedforward_layernorm(x))
        out: torch.Tensor = x + self.post_feedforward_layernorm(fed_forward)
        return out


class Gemma3ForCausalLM(CausalLM):
    """`native_kernels` is accepted for the registry's sake; Gemma's layers pick their kernels
    themselves (see the module doc)."""

    args: Gemma3Args

    def __init__(self, args: Gemma3Args, *, native_kernels: bool = True) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.rotary_global = RotaryEmbedding(args.rope_global, args.head_dim)
        self.rotary_local = RotaryEmbedding(args.rope_local, args.head_dim)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(args, index) for index in range(args.num_layers)
        )
        self.norm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = (
            None
            if args.tie_word_embeddings
            else nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        )
        self.fused_decode = None

    @classmethod
    def read_args(cls, hf_config: Any) -> Gemma3Args:
        return Gemma3Args.from_hf_config(hf_config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        kv_caches: list[LayerKVCache],
    ) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] after the final norm, for a flat token batch."""
        x = self.embed_tokens(input_ids)
        # NOTE: the scale is rounded to the model dtype before the product (sqrt(640) becomes
        # 25.25 in bf16), as transformers' Gemma3TextScaledWordEmbedding does.
        x = x * torch.tensor(self.args.hidden_size**0.5).to(x.dtype)
        global_cos_sin = self.rotary_global(positions, x.dtype)
        local_cos_sin = self.rotary_local(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            cos, sin = local_cos_sin if layer.is_sliding else global_cos_sin
            x = layer(x, cos, sin, kv_cache, metadata)
        out: torch.Tensor = self.norm(x)
        return out
