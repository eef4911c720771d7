"""The Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2) over a flat batch of tokens.

All sequences of a step are concatenated into one `[num_tokens, hidden]` tensor, so prefill chunks
and decode tokens of many sequences share every linear layer; only attention needs to know where
one sequence ends (see layers/attention/). q/k/v and gate/up are fused into one linear each: one
GEMM instead of three (two) reads the activations once and pays the per-call overhead once.

Numerics follow transformers' eager implementation op for op (RMSNorm in float32, RoPE tables in
float32 cast to the model dtype, each residual add rounded to the model dtype), so greedy output
can be compared token for token. For bf16 on CPU, the residual add + norm and the rotation +
KV-cache write run as native kernels that round the same way (kernels/rms_norm.py,
kernels/rotary_store.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.kernels import rms_norm as native_rms_norm
from inference.engine.kernels import rotary_store as native_rotary
from inference.engine.kernels import silu_and_mul as native_silu_and_mul
from inference.engine.kv_cache import LayerKVCache
from inference.engine.layers.attention import AttentionMetadata, paged_attention

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class FusedLayers(Protocol):
    """All decoder layers of a decode step in one call (kernels.decode_layers.FusedDecode).

    NOTE: a protocol, so the model does not import the kernel that imports the model.
    """

    def applies_to(
        self, metadata: AttentionMetadata, kv_caches: list[LayerKVCache], num_tokens: int
    ) -> bool: ...

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(slots=True)
class RopeArgs:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf_config(cls, config: Any) -> RopeArgs:
        """Read RoPE settings from transformers 5 `rope_parameters` or the older
        `rope_scaling` + `rope_theta` attributes."""
        params = getattr(config, "rope_parameters", None) or {}
        legacy = getattr(config, "rope_scaling", None) or {}
        merged = {**legacy, **params}
        rope_type = merged.get("rope_type") or merged.get("type") or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"RoPE type {rope_type!r} is not supported; supported: {list(SUPPORTED_ROPE_TYPES)}"
            )
        theta = merged.get("rope_theta", getattr(config, "rope_theta", None)) or 10000.0
        args = cls(theta=float(theta), rope_type=rope_type)
        if rope_type in ("linear", "llama3"):
            if "factor" not in merged:
                raise ValueError(f"RoPE type {rope_type!r} needs a 'factor' in the config")
            args.factor = float(merged["factor"])
        if rope_type == "llama3":
            args.low_freq_factor = float(merged["low_freq_factor"])
            args.high_freq_factor = float(merged["high_freq_factor"])
            args.original_max_position_embeddings = int(
                merged.get("original_max_position_embeddings", config.max_position_embeddings)
            )
        return args


@dataclass(slots=True)
class LlamaArgs:
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
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
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
        attention_bias = bool(getattr(config, "attention_bias", False))
        max_positions = config.max_position_embeddings
        # NOTE: sliding-window attention is not implemented; a window only changes results once a
        # sequence is longer than it, so capping the usable length keeps outputs exact.
        if getattr(config, "use_sliding_window", True) and getattr(config, "sliding_window", None):
            max_positions = min(max_positions, int(config.sliding_window))
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            rms_norm_eps=float(config.rms_norm_eps),
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            # NOTE: Qwen2 always has q/k/v biases and no o_proj bias; Llama's `attention_bias`
            # covers all four projections.
            qkv_bias=attention_bias or config.model_type == "qwen2",
            o_bias=attention_bias and config.model_type != "qwen2",
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            rope=RopeArgs.from_hf_config(config),
        )


def rope_inv_freq(rope: RopeArgs, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32, as transformers computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        # NOTE: Llama 3.1 keeps high frequencies, divides low ones by `factor` and interpolates
        # smoothly in between (transformers `_compute_llama3_parameters`).
        old_len = rope.original_max_position_embeddings
        low_freq_wavelen = old_len / rope.low_freq_factor
        high_freq_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    inv_freq: torch.Tensor

    def __init__(self, rope: RopeArgs, head_dim: int) -> None:
        super().__init__()
        # NOTE: explicit CPU device: the loader builds the model under a meta-device context and
        # this buffer is not a checkpoint weight, so it must hold real values from the start.
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [num_tokens, head_dim] for `apply_rotary`, once per step."""
        freqs = positions[:, None].float() * self.inv_freq
        cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [num_tokens, num_heads, head_dim] by the half-split (GPT-NeoX) convention.

    `cos` is [num_tokens, head_dim] and `sin` is [num_tokens, head_dim] with its first half
    negated (see `RotaryEmbedding`), so the rotation is x * cos + swap_halves(x) * sin: four ops,
    and bitwise what transformers computes as x * cos + rotate_half(x) * sin.
    """
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + swapped * sin[:, None, :]


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, *, native_kernels: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.native_kernels = native_kernels

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(norm(x), None), or with the residual stream: (norm(x + residual), x + residual).

        Adding the residual here lets bf16 on CPU do both in one native call (see
        kernels/rms_norm.py), which then updates `residual` in place.
        """
        if self.native_kernels and native_rms_norm.is_supported(x, self.weight):
            return native_rms_norm.add_rms_norm(x, residual, self.weight, self.eps), residual
        if residual is not None:
            x = residual = residual + x
        # NOTE: normalised in float32 and rounded before the weight is applied, as transformers
        # does. (F.rms_norm is bitwise the same but no faster on CPU: it is not fused there.)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype), residual


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs, *, native_kernels: bool = True) -> None:
        super().__init__()
        self.native_kernels = native_kernels
        self.num_heads = args.num_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.q_size = args.num_heads * args.head_dim
        self.kv_size = args.num_kv_heads * args.head_dim
        self.scale = args.head_dim**-0.5
        self.qkv_proj = nn.Linear(
            args.hidden_size, self.q_size + 2 * self.kv_size, bias=args.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, args.hidden_size, bias=args.o_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: LayerKVCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        is_stored = (
            self.native_kernels
            and len(kv_cache) == 2
            and native_rotary.is_supported(qkv, kv_cache[0], self.head_dim)
        )
        if is_stored:  # bf16 cache on CPU: rotation and cache write in one native call
            q, k = native_rotary.rotate_and_store(
                qkv,
                cos,
                sin,
                kv_cache[0],
                kv_cache[1],
                metadata.write_index,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
            )
        else:
            # NOTE: q and k sit side by side in each row, so one rotation covers both.
            qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, -1, self.head_dim)
            qk = apply_rotary(qk, cos, sin)
            q = qk[:, : self.num_heads]
            k = qk[:, self.num_heads :]
        out = paged_attention(
            q,
            k,
            v,
            kv_cache[0],
            kv_cache[1],
            metadata,
            scale=self.scale,
            kv_scales=kv_cache[2:],
            is_kv_stored=is_stored,
        )
        projected: torch.Tensor = self.o_proj(out.view(num_tokens, self.q_size))
        return projected


class MLP(nn.Module):
    def __init__(self, args: LlamaArgs, *, native_kernels: bool = True) -> None:
        super().__init__()
        self.native_kernels = native_kernels
        self.intermediate_size = args.intermediate_size
        self.gate_up_proj = nn.Linear(
            args.hidden_size, 2 * args.intermediate_size, bias=args.mlp_bias
        )
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up: torch.Tensor = self.gate_up_proj(x)
        if self.native_kernels and native_silu_and_mul.is_supported(gate_up):
            activated = native_silu_and_mul.silu_and_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)  # (gate | up), intermediate_size each
            activated = F.silu(gate) * up
        out: torch.Tensor = self.down_proj(activated)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, args: LlamaArgs, *, native_kernels: bool = True) -> None:
        super().__init__()
        native = native_kernels
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, native_kernels=native)
        self.self_attn = Attention(args, native_kernels=native)
        self.post_attention_layernorm = RMSNorm(
            args.hidden_size, args.rms_norm_eps, native_kernels=native
        )
        self.mlp = MLP(args, native_kernels=native)

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


class LlamaForCausalLM(nn.Module):
    """Parameter names follow transformers' (without the `model.` prefix) except the fused
    `self_attn.qkv_proj` and `mlp.gate_up_proj`; the loader maps checkpoints onto them.

    `native_kernels`: the norms, rotary + cache write and activation run the native kernels
    where they support the tensors (False: PyTorch ops only; EngineConfig.native_kernels)."""

    def __init__(self, args: LlamaArgs, *, native_kernels: bool = True) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.rotary_emb = RotaryEmbedding(args.rope, args.head_dim)
        self.layers = nn.ModuleList(
            DecoderLayer(args, native_kernels=native_kernels) for _ in range(args.num_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, native_kernels=native_kernels)
        # NOTE: tied models read the embedding matrix in `compute_logits` instead of holding a
        # second parameter, so there is nothing to re-tie after loading or casting.
        self.lm_head = (
            None
            if args.tie_word_embeddings
            else nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        )
        # Set by ModelRunner where all layers can run a decode step in one native call
        # (kernels/decode_layers.py); None: the layers run one by one.
        self.fused_decode: FusedLayers | None = None

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

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            table: torch.Tensor = self.embed_tokens.weight
            return F.linear(hidden, table)
        # NOTE: a module call, not its .weight: quantization swaps in its own linear here (for
        # tied models, the quantized embedding table; see quantization.py).
        logits: torch.Tensor = self.lm_head(hidden)
        return logits
