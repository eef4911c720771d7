"""The Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2, Qwen3) over a flat batch of tokens.

All sequences of a step are concatenated into one `[num_tokens, hidden]` tensor, so prefill chunks
and decode tokens of many sequences share every linear layer; only attention needs to know where
one sequence ends (see layers/attention/). q/k/v and gate/up are fused into one linear each: one
GEMM instead of three (two) reads the activations once and pays the per-call overhead once.
The members differ in options: q/k/v biases (Qwen2), per-head q/k norms (Qwen3), sliding-window
layers (Mistral, Qwen2/Qwen3 where configured), RoPE scaling (Llama 3).

Numerics follow transformers' eager implementation op for op (RMSNorm in float32, RoPE tables in
float32 cast to the model dtype, each residual add rounded to the model dtype), so greedy output
can be compared token for token. For bf16 on CPU, the residual add + norm and the rotation +
KV-cache write run as native kernels that round the same way (kernels/rms_norm.py,
kernels/rotary_store.py).
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
from inference.engine.layers.norm import RMSNorm
from inference.engine.layers.rotary import RopeArgs, RotaryEmbedding
from inference.engine.models.causal_lm import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    CausalLM,
    DecoderArgs,
    sliding_windows_of,
)


@dataclass(slots=True)
class LlamaArgs(DecoderArgs):
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on each query and key head
    rope: RopeArgs = field(default_factory=RopeArgs)

    @classmethod
    def from_hf_config(cls, config: Any) -> LlamaArgs:
        hidden_act = getattr(config, "hidden_act", "silu")
        if hidden_act != "silu":
            raise ValueError(f"activation {hidden_act!r} is not supported (only 'silu')")
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} attention heads are not a multiple of {num_kv_heads}")
        model_type = config.model_type
        attention_bias = bool(getattr(config, "attention_bias", False))
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
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            sliding_windows=sliding_windows_of(_layer_types(config), _sliding_window(config)),
            # NOTE: Qwen2 always has q/k/v biases and no o_proj bias; Llama's `attention_bias`
            # covers all four projections (as Qwen3's does).
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias and model_type != "qwen2",
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            rope=RopeArgs.from_hf_config(config),
        )


def _layer_types(config: Any) -> list[str]:
    """Each layer's attention type as transformers' implementation of this model type runs it.

    Qwen2/Qwen3 configs list them (derived from `use_sliding_window` and `max_window_layers`);
    Mistral slides every layer when it has a window and ignores `layer_types`; Llama never does.
    """
    num_layers = config.num_hidden_layers
    if config.model_type == "mistral":
        return [SLIDING_ATTENTION] * num_layers
    if config.model_type == "llama":
        return [FULL_ATTENTION] * num_layers
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return list(layer_types)
    first_sliding = getattr(config, "max_window_layers", num_layers)
    return [SLIDING_ATTENTION if i >= first_sliding else FULL_ATTENTION for i in range(num_layers)]


def _sliding_window(config: Any) -> int | None:
    """The configured window, None where `use_sliding_window` turns it off (Qwen2/Qwen3)."""
    if not getattr(config, "use_sliding_window", True):
        return None
    window: int | None = getattr(config, "sliding_window", None)
    return window


class DecoderLayer(nn.Module):
    def __init__(self, args: LlamaArgs, layer_index: int, *, native_kernels: bool = True) -> None:
        super().__init__()
        native = native_kernels
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, native_kernels=native)
        self.self_attn = SelfAttention(
            args.hidden_size,
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            scale=args.head_dim**-0.5,
            qkv_bias=args.qkv_bias,
            o_bias=args.o_bias,
            qk_norm="rms" if args.qk_norm else None,
            norm_eps=args.rms_norm_eps,
            sliding_window=args.sliding_windows[layer_index],
            native_kernels=native,
        )
        self.post_attention_layernorm = RMSNorm(
            args.hidden_size, args.rms_norm_eps, native_kernels=native
        )
        self.mlp = GatedMLP(
            args.hidden_size, args.intermediate_size, bias=args.mlp_bias, native_kernels=native
        )

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: LayerKVCache,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it is added).

        NOTE: each residual add happens inside the next norm (x + residual, then the norm), so
        the stream's values and rounding are transformers' (x = x + sublayer(norm(x))).
        """
        if residual is None:  # the first layer: x is the embeddings
            hidden, _ = self.input_layernorm(x)
            residual = x
        else:
            hidden, residual = self.input_layernorm(x, residual)
        hidden = self.self_attn(hidden, cos, sin, kv_cache, metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(CausalLM):
    """`native_kernels`: the norms, rotary + cache write and activation run the native kernels
    where they support the tensors (False: PyTorch ops only; EngineConfig.native_kernels)."""

    args: LlamaArgs

    def __init__(self, args: LlamaArgs, *, native_kernels: bool = True) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.rotary_emb = RotaryEmbedding(args.rope, args.head_dim)
        self.layers = nn.ModuleList(
            DecoderLayer(args, index, native_kernels=native_kernels)
            for index in range(args.num_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, native_kernels=native_kernels)
        # NOTE: tied models read the embedding matrix in `compute_logits` instead of holding a
        # second parameter, so there is nothing to re-tie after loading or casting.
        self.lm_head = (
            None
            if args.tie_word_embeddings
            else nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        )
        self.fused_decode = None

    @classmethod
    def read_args(cls, hf_config: Any) -> LlamaArgs:
        return LlamaArgs.from_hf_config(hf_config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        kv_caches: list[LayerKVCache],
    ) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] after the final norm, for a flat token batch."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions, x.dtype)
        fused = self.fused_decode
        if fused is not None and fused.applies_to(metadata, kv_caches, len(input_ids)):
            x, residual = fused(x, cos, sin, metadata)
        else:
            residual = None
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                x, residual = layer(x, residual, cos, sin, kv_cache, metadata)
        normed: tuple[torch.Tensor, torch.Tensor | None] = self.norm(x, residual)
        return normed[0]

    def run_first_layers(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        kv_caches: list[LayerKVCache],
        num_layers: int,
    ) -> None:
        """Run only the first `num_layers` decoder layers over a flat token batch: they write
        its keys/values to their caches (a chunk-KV reuse blend's probe, ModelRunner)."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(positions, x.dtype)
        residual = None
        for layer, kv_cache in zip(self.layers[:num_layers], kv_caches, strict=False):
            x, residual = layer(x, residual, cos, sin, kv_cache, metadata)
