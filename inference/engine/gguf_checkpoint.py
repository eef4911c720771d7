"""Reading a GGUF checkpoint into the engine's model, tensor by tensor, in the engine's formats.

Each weight matrix loads in the format its tensor's type calls for (`quantization="auto"`):
4-bit blocks (Q4_0, Q4_1, Q4_K) become `Int4Linear` groups of 32 that keep the file's codes;
5- to 8-bit types (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0) become `Int8Linear` rows, from the float32
values; float tensors, the norms and the biases stay floats in the model dtype. A fused projection
(q/k/v, gate/up) takes the most precise format among its shards, and the token table and lm_head
follow their tensors too (a 4-bit tied table serves both, as after `quantize_model`). "none"
dequantizes everything to the model dtype (the float32 reference path), "int8" and "int4" force
every linear to that format, as `quantize_model` does after a safetensors load.

At most one weight is ever held in float32, a chunk of rows at a time, and the file's pages are
dropped from memory once read (gguf_file.GGUFFile.release). The file's conversions from Hugging
Face are undone as transformers' GGUF loader does: llama.cpp interleaves the rotary halves of q/k
rows for the llama architecture (the rows are reordered back) and stores Gemma's norm weights
plus one (one is subtracted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from inference.engine.gguf_blocks import (
    EIGHT_BIT_TYPES,
    FOUR_BIT_TYPES,
    INT4_GROUP,
    SUPPORTED_TYPES,
    float_rows,
    int4_blocks,
)
from inference.engine.gguf_file import FLOAT_TYPES, GGUFFile, GGUFFileError, GGUFTensor
from inference.engine.gguf_metadata import hf_name_of
from inference.engine.layers.quantization import (
    TABLE_METHOD,
    Int4Linear,
    Int8Linear,
    QuantizedEmbedding,
    QuantizedLinear,
    check_quantization,
    quantize_rows_int8,
)
from inference.engine.models.causal_lm import CausalLM, DecoderArgs

logger = logging.getLogger(__name__)

# Tensors the engine recomputes: Llama 3's RoPE frequency factors come from the config.
_IGNORED_TENSORS = ("rope_freqs.weight",)
# Weight formats from the least to the most precise: a fused weight takes its most precise shard's.
FORMATS = ("int4", "int8", "float")
# NOTE: ~16 MB of float32 per chunk: the peak stays one chunk above the weights being built.
_CHUNK_ELEMENTS = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Shard:
    """One GGUF tensor's rows inside an engine weight, in transformers' row order."""

    tensor: GGUFTensor
    row_offset: int = 0  # where its rows start in the (fused) engine weight
    # stored row of each row (llama.cpp's q/k interleaving undone); None: the rows as stored
    row_order: np.ndarray | None = None
    norm_offset: float = 0.0  # added to the values (Gemma's norms: -1)

    @property
    def num_rows(self) -> int:
        return self.tensor.shape[0]

    def raw_rows(self, start: int, end: int) -> np.ndarray:
        """The stored bytes of rows [start, end), uint8 [rows, bytes per row]."""
        rows: np.ndarray = self.tensor.data[
            slice(start, end) if self.row_order is None else self.row_order[start:end]
        ]
        return rows

    def float_chunks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, float32 rows) over the shard, a chunk of rows at a time; a vector (a
        norm, a bias) comes whole."""
        ggml_type = self.tensor.ggml_type
        if len(self.tensor.shape) == 1:
            values = float_rows(self.tensor.data, ggml_type).reshape(-1)
            if self.row_order is not None:
                values = values[torch.from_numpy(self.row_order)]
            yield 0, values.add_(self.norm_offset) if self.norm_offset else values
            return
        step = max(1, _CHUNK_ELEMENTS // self.tensor.shape[-1])
        for start in range(0, self.num_rows, step):
            rows = float_rows(self.raw_rows(start, start + step), ggml_type)
            yield start, rows.add_(self.norm_offset) if self.norm_offset else rows


@dataclass(slots=True)
class _Weight:
    """An engine parameter and the GGUF tensors that fill it (several for fused ones)."""

    name: str
    shape: tuple[int, ...]
    shards: list[Shard | None] = field(default_factory=list)

    def filled_shards(self) -> list[Shard]:
        return [shard for shard in self.shards if shard is not None]


ParamName = Callable[[str], "tuple[str, int | None] | None"]


def load_gguf_weights(
    model: CausalLM,
    gguf: GGUFFile,
    *,
    param_name: ParamName,
    shard_offsets: dict[str, list[tuple[int, int]]],
    dtype: torch.dtype,
    quantization: str,
    group_size: int,
    native_kernels: bool = True,
) -> None:
    """Fill `model` (built on the meta device) from `gguf`, in place.

    `param_name` maps a transformers name onto (engine parameter, fused shard index) and
    `shard_offsets` places the shards (loader.py's conventions). GGUFFileError names the file
    and the tensor when a tensor has an unsupported type, a shape the config disagrees with, or
    no place in the model, and when the model's weights are not all in the file.
    """
    plan = _plan(model, gguf, param_name, shard_offsets)
    builder = _Builder(gguf, dtype, quantization, group_size, native_kernels)
    with torch.no_grad():
        for module_name, parent, child_name in _linear_layers(model):
            weight = plan.pop(f"{module_name}.weight")
            bias = plan.pop(f"{module_name}.bias", None)
            built = builder.linear(weight, bias, is_table=child_name == "lm_head")
            if built is not None:
                setattr(parent, child_name, built)
            else:  # float: the parameters are filled below
                plan[weight.name] = weight
                if bias is not None:
                    plan[bias.name] = bias
        if isinstance(model.embed_tokens, nn.Embedding):
            table_weight = plan.pop("embed_tokens.weight")
            table = builder.linear(table_weight, None, is_table=True)
            if table is None:
                plan[table_weight.name] = table_weight
            else:
                model.embed_tokens = QuantizedEmbedding(table, dtype)
                if model.lm_head is None:
                    # NOTE: a tied model's logits use the same table (as quantize_model does).
                    model.lm_head = table
        floats = {name: builder.float_tensor(weight, dtype) for name, weight in plan.items()}
    model.load_state_dict(floats, strict=False, assign=True)
    left = [name for name, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if left:
        raise GGUFFileError(f"{gguf.path}: no tensors for {', '.join(left[:10])}")
    if builder.num_refitted_groups:
        logger.info(
            "%s: %d int4 groups of one sign refitted to the native grid",
            gguf.path.name,
            builder.num_refitted_groups,
        )


def _linear_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
    """(module name, parent, attribute name) of every `nn.Linear` of `model`."""
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                prefix = f"{parent_name}." if parent_name else ""
                yield f"{prefix}{child_name}", parent, child_name


def _plan(
    model: CausalLM,
    gguf: GGUFFile,
    param_name: ParamName,
    shard_offsets: dict[str, list[tuple[int, int]]],
) -> dict[str, _Weight]:
    """Engine parameter name -> the GGUF tensors that fill it, every tensor checked first."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    plan: dict[str, _Weight] = {}
    for tensor in gguf.tensors.values():
        if tensor.name in _IGNORED_TENSORS:
            continue
        hf_name = hf_name_of(tensor.name, gguf.architecture)
        target = None if hf_name is None else param_name(hf_name)
        if hf_name is not None and target is None:
            continue  # a name the engine does not load (a tied checkpoint's lm_head copy)
        if target is None or target[0] not in shapes:
            raise GGUFFileError(
                f"{gguf.path}: tensor {tensor.name!r} has no place in a "
                f"{gguf.architecture} model of this config"
            )
        name, shard_index = target
        if tensor.ggml_type not in SUPPORTED_TYPES:
            raise GGUFFileError(
                f"{gguf.path}: tensor {tensor.name!r} is of quantization type "
                f"{tensor.ggml_type.name}, which the engine cannot load; supported: "
                f"{', '.join(t.name for t in SUPPORTED_TYPES)}"
            )
        expected, row_offset = shapes[name], 0
        shards = shard_offsets.get(name.split(".")[-2], []) if shard_index is not None else []
        if shard_index is not None:
            row_offset, num_rows = shards[shard_index]
            expected = (num_rows, *expected[1:])
        if tensor.shape != expected:
            raise GGUFFileError(
                f"{gguf.path}: tensor {tensor.name!r} has shape {list(tensor.shape)}, but the "
                f"model's config makes {name} {list(expected)}"
            )
        weight = plan.setdefault(name, _Weight(name, shapes[name], [None] * max(1, len(shards))))
        weight.shards[shard_index or 0] = Shard(
            tensor,
            row_offset=row_offset,
            row_order=_row_order(hf_name, tensor, gguf.architecture, model.args),
            norm_offset=_norm_offset(name, gguf.architecture),
        )
    incomplete = [name for name in shapes if name not in plan or None in plan[name].shards]
    if incomplete:
        raise GGUFFileError(
            f"{gguf.path}: the file has no tensors for {', '.join(incomplete[:10])}"
            + (f" and {len(incomplete) - 10} more" if len(incomplete) > 10 else "")
        )
    return plan


def _norm_offset(name: str, architecture: str) -> float:
    """llama.cpp stores Gemma's norm weights as 1 + w (the scale they apply), transformers w."""
    return -1.0 if architecture == "gemma3" and name.endswith("norm.weight") else 0.0


def _row_order(
    hf_name: str | None, tensor: GGUFTensor, architecture: str, args: DecoderArgs
) -> np.ndarray | None:
    """llama.cpp's converter interleaves the two rotary halves of each q/k head for the llama
    architecture (its rotation pairs adjacent values); the rows back in transformers' order."""
    if architecture != "llama" or hf_name is None:
        return None
    if ".self_attn.q_proj." in hf_name:
        num_heads = args.num_heads
    elif ".self_attn.k_proj." in hf_name:
        num_heads = args.num_kv_heads
    else:
        return None
    num_rows = tensor.shape[0]
    half = num_rows // num_heads // 2
    # stored row (head, i, half) -> transformers' row (head, half, i)
    return np.arange(num_rows).reshape(num_heads, half, 2).transpose(0, 2, 1).reshape(-1)


class _Builder:
    """Builds each engine weight from its shards in the format the quantization setting picks."""

    def __init__(
        self,
        gguf: GGUFFile,
        dtype: torch.dtype,
        quantization: str,
        group_size: int,
        native_kernels: bool,
    ) -> None:
        check_quantization(quantization, group_size)
        self.gguf = gguf
        self.dtype = dtype
        self.quantization = quantization
        self.group_size = group_size
        self.native_kernels = native_kernels
        self.num_refitted_groups = 0

    def format_of(self, weight: _Weight, *, is_table: bool) -> str:
        """ "float", "int8" or "int4" for a weight matrix (or token table)."""
        if self.quantization == "none":
            return "float"
        if self.quantization in ("int8", "int4"):
            return TABLE_METHOD if is_table else self.quantization
        return max(
            (_format_of_type(shard.tensor.ggml_type) for shard in weight.filled_shards()),
            key=FORMATS.index,
        )

    def linear(
        self, weight: _Weight, bias: _Weight | None, *, is_table: bool
    ) -> QuantizedLinear | None:
        """The quantized layer of `weight` (+ `bias`); None when it stays float."""
        weight_format = self.format_of(weight, is_table=is_table)
        if weight_format == "float":
            return None
        bias_tensor = None if bias is None else self.float_tensor(bias, self.dtype)
        layer: QuantizedLinear
        if weight_format == "int8":
            codes, scales = self._int8_rows(weight)
            layer = Int8Linear.from_codes(
                codes, scales, bias_tensor, native_kernels=self.native_kernels
            )
        elif self.group_size == INT4_GROUP and all(
            shard.tensor.ggml_type in FOUR_BIT_TYPES for shard in weight.filled_shards()
        ):
            codes, scales, offsets = self._int4_codes(weight)
            layer = Int4Linear.from_codes(
                codes,
                scales,
                offsets,
                bias_tensor,
                INT4_GROUP,
                dtype=self.dtype,
                native_kernels=self.native_kernels,
            )
            self.num_refitted_groups += layer.num_refitted_groups
        else:
            layer = Int4Linear(
                self.float_tensor(weight, torch.float32),
                bias_tensor,
                self.group_size,
                native_kernels=self.native_kernels,
                dtype=self.dtype,
            )
        self._release(weight)
        return layer

    def float_tensor(self, weight: _Weight, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(weight.shape, dtype=dtype)
        for shard in weight.filled_shards():
            for start, rows in shard.float_chunks():
                first = shard.row_offset + start
                out[first : first + rows.shape[0]] = rows
        self._release(weight)
        return out

    def _int8_rows(self, weight: _Weight) -> tuple[torch.Tensor, torch.Tensor]:
        codes = torch.empty(weight.shape, dtype=torch.int8)
        scales = torch.empty(weight.shape[0], dtype=self.dtype)
        for shard in weight.filled_shards():
            for start, rows in shard.float_chunks():
                first = shard.row_offset + start
                chunk = slice(first, first + rows.shape[0])
                codes[chunk], scales[chunk] = quantize_rows_int8(rows, self.dtype)
        return codes, scales

    def _int4_codes(self, weight: _Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        num_rows, num_columns = weight.shape
        codes = torch.empty(num_rows, num_columns, dtype=torch.uint8)
        scales = torch.empty(num_rows, num_columns // INT4_GROUP)
        offsets = torch.empty_like(scales)
        step = max(1, _CHUNK_ELEMENTS // num_columns)
        for shard in weight.filled_shards():
            for start in range(0, shard.num_rows, step):
                end = min(start + step, shard.num_rows)
                blocks = int4_blocks(shard.raw_rows(start, end), shard.tensor.ggml_type)
                rows = slice(shard.row_offset + start, shard.row_offset + end)
                codes[rows], scales[rows], offsets[rows] = (
                    blocks.codes,
                    blocks.scales,
                    blocks.offsets,
                )
        return codes, scales, offsets

    def _release(self, weight: _Weight) -> None:
        for shard in weight.filled_shards():
            self.gguf.release(shard.tensor)


def _format_of_type(ggml_type: Any) -> str:
    if ggml_type in FOUR_BIT_TYPES:
        return "int4"
    if ggml_type in EIGHT_BIT_TYPES:
        return "int8"
    if ggml_type in FLOAT_TYPES:
        return "float"
    raise ValueError(f"no engine format for {ggml_type}")  # _plan refused it already
