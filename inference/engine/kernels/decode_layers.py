"""The decoder layers of a pure decode step in one native call (`csrc/decode_layers.c`).

A decode step runs ~10 small kernels per layer. Called from Python one by one, each pays a
dispatch through the interpreter and PyTorch, on caches the streamed weights have just
flushed: measured on SmolLM2-135M (int4, 1,300 tokens of context), the layers took ~14 ms a
step of which the kernels themselves were ~6. `FusedDecode` describes every layer's weights
and KV cache to the C code once, at load time; a step then makes one call for all the layers.
The embedding lookup, the final norm and the logits stay in Python.

It applies to bf16 and float32 models whose linear layers all run native kernels (AMX bf16
where the CPU has AMX, or the native int4 and int8 matmuls: so quantized models, GGUF's mixes
of 4- and 8-bit tensors included, on every CPU with the kernels' instruction sets) with a KV
cache of the model's dtype, and to steps made of single-token decodes only without a
shared-prefix cascade; everything else (prefill, mixed steps, a cascade over a shared prefix,
an int8 KV cache) takes the module path.
Results are the module path's bit for bit: the same kernels in the same order on the same
inputs (tests/engine/kernels/test_decode_layers.py).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from inference.engine.kernels import KernelFunction
from inference.engine.kernels import paged_decode_attention as paged_decode_kernel
from inference.engine.kv_cache import LayerKVCache
from inference.engine.layers.attention import AttentionMetadata
from inference.engine.layers.linear import AmxLinear
from inference.engine.layers.quantization import Int4Linear, Int8Linear
from inference.engine.models.causal_lm import CausalLM
from inference.engine.models.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from inference.engine.models.llama import DecoderLayer

logger = logging.getLogger(__name__)

LINEAR_BF16_AMX, LINEAR_INT4, LINEAR_INT8 = 0, 1, 2  # csrc: enum


class _Linear(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int64),
        ("out_features", ctypes.c_int64),
        ("padded_out_features", ctypes.c_int64),
        ("in_features", ctypes.c_int64),
        ("group_size", ctypes.c_int64),
        ("weight", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("zero_points", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("qkv", _Linear),
        ("o", _Linear),
        ("gate_up", _Linear),
        ("down", _Linear),
        ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("num_layers", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("num_heads", ctypes.c_int64),
        ("num_kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("intermediate", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
    ]


_pointer, _size = ctypes.c_void_p, ctypes.c_int64
_kernel = KernelFunction(
    "decode_layers",
    "decode_layers",
    [_pointer] * 8 + [_size, _pointer, _pointer, _size, _size, _size, _size, ctypes.c_int],
)


def _describe_linear(layer: nn.Module, dtype: torch.dtype) -> _Linear | None:
    bias = getattr(layer, "bias", None)
    if bias is not None and (bias.dtype != dtype or bias.shape[0] % 16):
        return None  # NOTE: the C code adds a bias 16 values at a time
    bias_pointer = None if bias is None else bias.data_ptr()
    if isinstance(layer, AmxLinear):
        return _Linear(
            LINEAR_BF16_AMX,
            layer.out_features,
            layer.out_features,
            layer.in_features,
            0,
            layer.packed_weight.data_ptr(),
            None,
            None,
            bias_pointer,
        )
    if isinstance(layer, Int4Linear) and layer.is_native:
        return _Linear(
            LINEAR_INT4,
            layer.out_features,
            layer.weight_int4.shape[0],
            layer.in_features,
            layer.group_size,
            layer.weight_int4.data_ptr(),
            layer.scales.data_ptr(),
            layer.zero_points.data_ptr(),
            bias_pointer,
        )
    if isinstance(layer, Int8Linear) and layer.is_native and layer.dtype == dtype:
        return _Linear(
            LINEAR_INT8,
            layer.out_features,
            layer.weight_int8.shape[0],
            layer.in_features,
            0,
            layer.weight_int8.data_ptr(),
            layer.scales.data_ptr(),
            None,
            bias_pointer,
        )
    return None


def _describe_layer(
    layer: DecoderLayer, k_cache: torch.Tensor, v_cache: torch.Tensor, dtype: torch.dtype
) -> _Layer | None:
    norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
    if any(w.dtype != dtype or not w.is_contiguous() for w in norms):
        return None
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return None
    attention, mlp = layer.self_attn, layer.mlp
    linears = [
        _describe_linear(linear, dtype)
        for linear in (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)
    ]
    if any(linear is None for linear in linears):
        return None
    return _Layer(
        norms[0].data_ptr(), norms[1].data_ptr(), *linears, k_cache.data_ptr(), v_cache.data_ptr()
    )


def is_supported(model: CausalLM, kv_caches: list[LayerKVCache], block_size: int) -> bool:
    """Whether all decoder layers of `model` can run in one native call with these caches.

    The C code runs the plain Llama layer: no per-head q/k norms (Qwen3), no sliding windows,
    and no other architecture (Gemma's norms and GeGLU). The attention inside is
    paged_decode_attention's, so its shapes apply; the norms and the KV cache must be of the
    model's dtype (bf16, or float32 on CPUs without native bf16), every linear layer must run a
    native kernel (AMX bf16, native int4 or int8; AMX layers only exist where the CPU has AMX,
    and the library links the AMX matmul there), and the kernel must be built for this machine.
    """
    if not isinstance(model, LlamaForCausalLM):
        return False
    args = model.args
    dtype = _model_dtype(model)
    return (
        not args.qk_norm
        and not args.distinct_sliding_windows
        and args.num_heads % args.num_kv_heads == 0
        and paged_decode_kernel.is_supported(
            dtype,
            torch.device("cpu"),
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            block_size,
        )
        and args.hidden_size % 16 == 0
        and args.intermediate_size % 16 == 0
        and all(len(cache) == 2 and cache[0].dtype == dtype for cache in kv_caches)
        and _describe_layers(model, kv_caches) is not None
        and _kernel(dtype) is not None
    )


def _model_dtype(model: LlamaForCausalLM) -> torch.dtype:
    """The dtype of the model's activations: its norms' weights'."""
    return cast("DecoderLayer", model.layers[0]).input_layernorm.weight.dtype


def _describe_layers(model: LlamaForCausalLM, kv_caches: list[LayerKVCache]) -> list[_Layer] | None:
    layers = []
    dtype = _model_dtype(model)
    for layer, (k_cache, v_cache) in zip(model.layers, kv_caches, strict=True):
        described = _describe_layer(cast("DecoderLayer", layer), k_cache, v_cache, dtype)
        if described is None:
            return None
        layers.append(described)
    return layers


class FusedDecode:
    """One native call for all decoder layers of a pure decode step (see the module doc)."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        layers: list[_Layer],
        kv_caches: list[LayerKVCache],
        block_size: int,
        kernel: Callable[..., int],
    ) -> None:
        args = model.args
        first_layer = cast("DecoderLayer", model.layers[0])
        # NOTE: no reference to the model (which holds this object: a cycle would keep a
        # replaced model's weights until a full garbage collection); the model owns the weights
        # behind the pointers below and this object with them. The caches are the runner's.
        self.kv_caches = kv_caches
        self._kernel = kernel
        self._model = _Model(
            args.num_layers,
            args.hidden_size,
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            args.intermediate_size,
            block_size,
            first_layer.input_layernorm.eps,
            first_layer.self_attn.scale,
        )
        self._layers = (_Layer * len(layers))(*layers)
        self._num_kv_heads = args.num_kv_heads
        # Whether decodes sharing leading blocks attend them once, together (cascade), through
        # the native shared-prefix kernel (kernels/paged_prefill_attention.py): set by the
        # runner where that kernel serves its prefill attention.
        self.cascades = False
        # Decode steps of more tokens run layer by layer: set where the layers keep dense
        # weights whose GEMM beats the fused call's quantized matmuls from that many tokens on.
        self.max_tokens: int | None = None

    @classmethod
    def build(
        cls, model: CausalLM, kv_caches: list[LayerKVCache], block_size: int
    ) -> FusedDecode | None:
        """The fused path for this model and cache, or None where it is not supported."""
        if not is_supported(model, kv_caches, block_size) or not isinstance(
            model, LlamaForCausalLM
        ):
            return None
        layers = _describe_layers(model, kv_caches)
        kernel = _kernel(_model_dtype(model))
        if layers is None or kernel is None:
            return None
        logger.info("decode steps: all %d layers in one native call", model.args.num_layers)
        return cls(model, layers, kv_caches, block_size, kernel)

    def takes(self, num_decodes: int) -> bool:
        """Whether a pure decode step of `num_decodes` sequences is the fused call's to run."""
        return self.max_tokens is None or num_decodes <= self.max_tokens

    def applies_to(
        self, metadata: AttentionMetadata, kv_caches: list[LayerKVCache], num_tokens: int
    ) -> bool:
        """Whether this step is one the fused call runs: single-token decodes only (at most
        `max_tokens` of them), on the caches it was built for, attended in one part or, where it
        `cascades`, with the shared prefix's blocks apart."""
        has_shared_prefix = metadata.decode_shared_gather_index is not None
        return (
            kv_caches is self.kv_caches
            and self.takes(num_tokens)
            and metadata.decode_block_table is not None
            and metadata.num_decode_tokens == num_tokens
            and (
                not has_shared_prefix
                or (self.cascades and metadata.decode_shared_block_table is not None)
            )
            and not metadata.prefills
        )

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the last layer's MLP output, the residual stream) for embeddings x [tokens, hidden]."""
        num_tokens = x.shape[0]
        x = x.contiguous().clone()  # written in place, layer after layer
        residual = torch.empty_like(x)
        cos, sin = cos.contiguous(), sin.contiguous()
        block_table, context_lens = metadata.decode_block_table, metadata.decode_context_lens
        if block_table is None or context_lens is None:
            raise ValueError("the fused decode runs decode steps of the native kernel's metadata")
        shared_table = metadata.decode_shared_block_table
        if shared_table is not None and not self.cascades:
            raise ValueError("this fused decode does not attend a shared prefix apart")
        num_threads = torch.get_num_threads()
        blocks_per_part, num_parts = paged_decode_kernel.context_partitions(
            num_tokens, self._num_kv_heads, block_table.shape[1], num_threads
        )
        status = self._kernel(
            ctypes.addressof(self._model),
            ctypes.addressof(self._layers),
            x.data_ptr(),
            residual.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            metadata.write_index.data_ptr(),
            block_table.data_ptr(),
            block_table.shape[1],
            context_lens.data_ptr(),
            None if shared_table is None else shared_table.data_ptr(),
            0 if shared_table is None else shared_table.numel() * self._model.block_size,
            num_tokens,
            blocks_per_part * self._model.block_size,
            num_parts,
            num_threads,
        )
        if status != 0:
            raise RuntimeError(f"the fused decode kernel failed (status {status})")
        return x, residual
