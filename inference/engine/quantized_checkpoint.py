"""Reading AWQ, GPTQ and compressed-tensors int4 checkpoints into the engine's int4 layers.

The three safetensors layouts of 4-bit weights in groups of input columns that vLLM reads, told
apart by config.json's `quantization_config` (`read_int4_format`); w = s (q - z) per group:

- AutoAWQ GEMM (`quant_method: awq`, `version: gemm`): `qweight` int32 [in, out / 8] and
  `qzeros` int32 [in / group, out / 8], eight values a word in AWQ's order (nibble i of word c
  is column 8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]), `scales` [in / group, out].
- GPTQ (`quant_method: gptq`, AutoGPTQ / GPTQModel): `qweight` int32 [in / 8, out] (nibble i of
  word r is input row 8r + i), `qzeros` int32 [in / group, out / 8] (nibble i: column 8c + i),
  `scales` [in / group, out], `g_idx` int32 [in]: each input column's group. checkpoint_format
  "gptq" (the default) stores z - 1 in 4 bits, "gptq_v2" stores z; read as GPTQModel reads them
  (z = stored + 1 in 4 bits for "gptq", as vLLM does except for a stored 15, a zero of 0).
- compressed-tensors `pack-quantized` (llmcompressor's W4A16 recipes, GPTQ or AWQ):
  `weight_packed` int32 [out, in / 8] (nibble i of word c: column 8c + i) holding q + 8 for a
  signed q in [-8, 7], `weight_scale` [out, in / group], `weight_shape` [out, in], and for
  asymmetric schemes `weight_zero_point`, signed + 8 as well, eight rows a word [out / 8, groups].

"auto" keeps the file's codes: each linear layer stored in int4 becomes an `Int4Linear` in the
checkpoint's groups (`Int4Linear.from_codes`: scales s, offsets -z s), read a layer at a time
with no float copy of a weight on the way, so the weights take about the file's bytes. "int4" does
the same (requantizing 4-bit values to other groups could only add error; the configured group
size applies to the float layers that "int4" quantizes, loader.py). "none" dequantizes to the
model dtype (the float32 reference path) and "int8" requantizes each dequantized float32 row, as
for a GGUF. Embeddings, norms, biases and the layers the file keeps in float (an untied lm_head,
the config's ignore list) load as from any safetensors checkpoint (loader.py).

Act-order (GPTQ's `desc_act`, `g_idx` not column // group): the columns are stored sorted by group
and the layer permutes its input the same way (layers/act_order.py), which is exact. q/k/v (and
gate/up) see the same input, so GPTQ gives them one order; shards of one fused layer with
different orders are refused. Anything else the engine cannot load (other bit widths, group sizes,
packings, activation quantization) is refused at load with a ValueError naming the file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from inference.engine.layers.act_order import ActOrderLinear
from inference.engine.layers.quantization import (
    INT4_GROUP_SIZES,
    Int4Linear,
    Int8Linear,
    check_quantization,
)

METHODS = ("awq", "gptq", "compressed-tensors")
# (required, optional) tensors of a layer, by the suffix after its module name
_TENSORS = {
    "awq": (("qweight", "qzeros", "scales"), ()),
    "gptq": (("qweight", "qzeros", "scales"), ("g_idx",)),
    "compressed-tensors": (
        ("weight_packed", "weight_scale", "weight_shape"),
        ("weight_zero_point", "weight_g_idx"),
    ),
}
_GPTQ_ZERO_OFFSETS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> stored zero + offset
_AWQ_COLUMNS = (0, 4, 1, 5, 2, 6, 3, 7)  # the inverse of AWQ's packing order
_SHIFTS = tuple(range(0, 32, 4))
_DTYPE_KINDS: dict[str, Callable[[torch.dtype], bool]] = {
    "int32": lambda dtype: dtype == torch.int32,
    "int": lambda dtype: dtype in (torch.int32, torch.int64),
    "float": lambda dtype: dtype in (torch.float16, torch.bfloat16, torch.float32),
}

ParamName = Callable[[str], "tuple[str, int | None] | None"]


@dataclass(frozen=True, slots=True)
class Int4Format:
    """What config.json says about a checkpoint's int4 tensors."""

    method: str  # one of METHODS
    group_size: int
    zero_offset: int = 0  # added (in 4 bits) to a stored zero point: GPTQ's classic z - 1


@dataclass(frozen=True, slots=True)
class Int4Weight:
    """One weight in 4-bit codes: w = scales * (codes - zeros), per group of input columns."""

    codes: torch.Tensor  # uint8 [out, in], in [0, 15]
    scales: torch.Tensor  # float32 [out, groups]
    zeros: torch.Tensor  # float32 [out, groups]
    group_index: torch.Tensor  # int64 [in]: the group of each input column

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] (exact: a 4-bit difference times an fp16/bf16 scale)."""
        index = self.group_index
        return (self.codes.float() - self.zeros[:, index]) * self.scales[:, index]


def read_int4_format(config_path: Path) -> Int4Format | None:
    """The int4 format of the checkpoint whose config.json is `config_path`; None when it has no
    `quantization_config` (a float checkpoint). ValueError naming the file when the engine cannot
    load it."""
    config = json.loads(config_path.read_text())
    quantization = config.get("quantization_config")
    if quantization is None:
        return None

    def refuse(reason: str) -> ValueError:
        return ValueError(f"{config_path}: {reason}")

    if not isinstance(quantization, dict):
        raise refuse("quantization_config is not a JSON object")
    method = str(quantization.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors_format(quantization, refuse)
    if method not in METHODS:
        raise refuse(
            f"quantization_config.quant_method {method!r} is not supported; the engine loads "
            f"int4 checkpoints of {', '.join(METHODS)}"
        )
    bits = quantization.get("bits", quantization.get("w_bit"))
    group_size = quantization.get("group_size", quantization.get("q_group_size"))
    if bits != 4:
        raise refuse(f"{method} checkpoint of {bits}-bit weights; the engine loads 4-bit ones only")
    zero_offset = 0
    if method == "awq":
        version = str(quantization.get("version", "gemm")).lower()
        if version != "gemm":
            raise refuse(f"AWQ version {version!r} is not supported; the engine reads 'gemm'")
    else:
        packing = str(quantization.get("checkpoint_format") or "gptq").lower()
        if packing not in _GPTQ_ZERO_OFFSETS:
            raise refuse(
                f"GPTQ checkpoint_format {packing!r} is not supported; the engine reads "
                f"{', '.join(_GPTQ_ZERO_OFFSETS)}"
            )
        if quantization.get("dynamic"):
            raise refuse("GPTQ per-module overrides ('dynamic') are not supported")
        zero_offset = _GPTQ_ZERO_OFFSETS[packing]
    return Int4Format(method, _checked_group_size(group_size, refuse), zero_offset)


def _compressed_tensors_format(
    quantization: dict[str, Any], refuse: Callable[[str], ValueError]
) -> Int4Format:
    status = quantization.get("quantization_status", "compressed")
    if status != "compressed":
        raise refuse(f"compressed-tensors status {status!r}: the weights are not compressed")
    for unsupported in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if quantization.get(unsupported):
            raise refuse(f"compressed-tensors {unsupported} is not supported")
    groups = quantization.get("config_groups") or {}
    if not groups:
        raise refuse("compressed-tensors config has no config_groups")
    group_sizes = set()
    for name, group in groups.items():
        weights = group.get("weights") or {}
        packing = group.get("format") or quantization.get("format")
        scheme = (weights.get("num_bits"), weights.get("type"), weights.get("strategy"))
        if packing != "pack-quantized":
            raise refuse(
                f"compressed-tensors format {packing!r} ({name}) is not supported; the engine "
                "reads 'pack-quantized'"
            )
        if scheme != (4, "int", "group"):
            raise refuse(
                f"compressed-tensors weights of {scheme[0]} bits, type {scheme[1]!r}, strategy "
                f"{scheme[2]!r} ({name}); the engine loads 4-bit int weights in groups"
            )
        if group.get("input_activations") or group.get("output_activations"):
            raise refuse(f"compressed-tensors activation quantization ({name}) is not supported")
        group_sizes.add(_checked_group_size(weights.get("group_size"), refuse))
    if len(group_sizes) > 1:
        raise refuse(f"compressed-tensors groups of several sizes {sorted(group_sizes)}")
    return Int4Format("compressed-tensors", group_sizes.pop())


def _checked_group_size(group_size: Any, refuse: Callable[[str], ValueError]) -> int:
    if isinstance(group_size, bool) or group_size not in INT4_GROUP_SIZES:
        raise refuse(
            f"group_size {group_size!r} is not supported; the engine's int4 layers take groups "
            f"of {', '.join(map(str, INT4_GROUP_SIZES))}"
        )
    return int(group_size)


@dataclass(slots=True)
class _Shard:
    """One checkpoint linear (a q_proj, ...): its tensors and its rows in the engine's layer."""

    prefix: str  # the checkpoint's module name
    row_offset: int
    num_rows: int
    tensors: dict[str, tuple[Path, str]] = field(default_factory=dict)  # suffix -> (file, key)
    bias: tuple[Path, str] | None = None

    @property
    def path(self) -> Path:
        """The file of its (first) int4 tensor, which errors name."""
        return next(iter(self.tensors.values()))[0]


@dataclass(slots=True)
class _Layer:
    """An engine linear layer (a fused one has several shards) stored in int4."""

    name: str
    linear: nn.Linear
    shards: list[_Shard | None]

    def filled_shards(self) -> list[_Shard]:
        return [shard for shard in self.shards if shard is not None]


def load_int4_layers(
    model: nn.Module,
    files: list[Path],
    int4_format: Int4Format,
    *,
    param_name: ParamName,
    shard_offsets: dict[str, list[tuple[int, int]]],
    dtype: torch.dtype,
    quantization: str,
    native_kernels: bool = True,
) -> set[str]:
    """Replace each linear layer of `model` (built on the meta device) that `files` store in int4
    by its layer in `quantization`'s format (see the module doc), in place.

    `param_name` and `shard_offsets` are loader.py's name mapping and fused-shard places. Returns
    the checkpoint keys read (the int4 tensors and those layers' biases): the float loading skips
    them. ValueError naming the file when a tensor has no place in the model, a shape or dtype the
    config disagrees with, or when a layer's tensors are incomplete.
    """
    check_quantization(quantization, int4_format.group_size)
    linears = {name: m for name, m in model.named_modules() if type(m) is nn.Linear}
    with contextlib.ExitStack() as stack:
        readers = {
            path: stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            for path in files
        }
        layers, read_keys = _plan(readers, int4_format, linears, param_name, shard_offsets)
        with torch.no_grad():
            for layer in layers:
                built = _build(layer, readers, int4_format, dtype, quantization, native_kernels)
                parent, _, child = layer.name.rpartition(".")
                setattr(model.get_submodule(parent), child, built)
    return read_keys


def _plan(
    readers: Mapping[Path, Any],
    int4_format: Int4Format,
    linears: dict[str, nn.Linear],
    param_name: ParamName,
    shard_offsets: dict[str, list[tuple[int, int]]],
) -> tuple[list[_Layer], set[str]]:
    """The engine layers stored in int4, every tensor placed and checked for presence first."""
    required, optional = _TENSORS[int4_format.method]
    suffixes = {*required, *optional}
    locations = {key: path for path, reader in readers.items() for key in reader.keys()}  # noqa: SIM118
    layers: dict[str, _Layer] = {}
    read_keys: set[str] = set()
    for key, path in locations.items():
        prefix, _, suffix = key.rpartition(".")
        if suffix not in suffixes:
            continue
        read_keys.add(key)
        target = param_name(f"{prefix}.weight")
        if target is None:
            continue  # a name the engine does not load (a tied checkpoint's lm_head copy)
        name, shard_index = target
        module_name = name.removesuffix(".weight")
        if module_name not in linears:
            raise ValueError(f"{path}: tensor {key!r} has no place in the model")
        places = shard_offsets.get(module_name.rpartition(".")[2], [])
        linear = linears[module_name]
        layer = layers.setdefault(
            module_name, _Layer(module_name, linear, [None] * max(1, len(places)))
        )
        row_offset, num_rows = (0, linear.out_features)
        if shard_index is not None:
            row_offset, num_rows = places[shard_index]
        shard = layer.shards[shard_index or 0]
        if shard is None:
            shard = layer.shards[shard_index or 0] = _Shard(prefix, row_offset, num_rows)
        shard.tensors[suffix] = (path, key)
    for layer in layers.values():
        for shard in layer.filled_shards():
            path = shard.path
            missing = [suffix for suffix in required if suffix not in shard.tensors]
            if missing:
                raise ValueError(f"{path}: {shard.prefix} has no {', '.join(missing)}")
            bias_key = f"{shard.prefix}.bias"
            if bias_key in locations:
                if layer.linear.bias is None:
                    raise ValueError(f"{path}: {bias_key} has no place in the model")
                shard.bias = (locations[bias_key], bias_key)
                read_keys.add(bias_key)
            elif layer.linear.bias is not None:
                raise ValueError(f"{path}: {shard.prefix} has no bias, which the config calls for")
        if None in layer.shards:
            stored = ", ".join(shard.prefix for shard in layer.filled_shards())
            raise ValueError(
                f"{path}: only some projections of {layer.name} are in int4 ({stored}); the "
                "engine fuses them into one layer and needs all of them in one format"
            )
    return list(layers.values()), read_keys


def _build(
    layer: _Layer,
    readers: Mapping[Path, Any],
    int4_format: Int4Format,
    dtype: torch.dtype,
    quantization: str,
    native_kernels: bool,
) -> nn.Module:
    """The engine module of `layer` in the format `quantization` calls for."""
    in_features = layer.linear.in_features
    weights = [
        _read_int4(shard, readers, int4_format, in_features) for shard in layer.filled_shards()
    ]
    group_index = weights[0].group_index
    if any(not torch.equal(w.group_index, group_index) for w in weights[1:]):
        raise ValueError(
            f"{layer.filled_shards()[0].path}: the projections of {layer.name} have different "
            "act-order groups (g_idx)"
        )
    weight = Int4Weight(
        torch.cat([w.codes for w in weights]),
        torch.cat([w.scales for w in weights]),
        torch.cat([w.zeros for w in weights]),
        group_index,
    )
    bias = _read_bias(layer, readers, dtype)
    if quantization == "none":
        linear = layer.linear
        linear.weight = nn.Parameter(weight.dequantize().to(dtype), requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias, requires_grad=False)
        return linear
    if quantization == "int8":
        return Int8Linear(weight.dequantize(), bias, dtype=dtype, native_kernels=native_kernels)
    group_size = int4_format.group_size
    order = _input_order(weight.group_index, group_size)
    codes = weight.codes if order is None else weight.codes[:, order]
    int4 = Int4Linear.from_codes(
        codes.contiguous(),
        weight.scales,
        -weight.zeros * weight.scales,
        bias,
        group_size,
        dtype=dtype,
        native_kernels=native_kernels,
    )
    return int4 if order is None else ActOrderLinear(int4, order)


def _read_int4(
    shard: _Shard, readers: Mapping[Path, Any], int4_format: Int4Format, in_features: int
) -> Int4Weight:
    """The codes, scales and zero points of one checkpoint linear, every shape checked."""
    num_rows, group_size, method = shard.num_rows, int4_format.group_size, int4_format.method
    if in_features % group_size:
        raise ValueError(
            f"{shard.path}: {shard.prefix} has {in_features} input features, not a multiple of "
            f"the checkpoint's group_size {group_size}"
        )
    num_groups = in_features // group_size

    def read(suffix: str, shape: tuple[int, ...], kind: str) -> torch.Tensor:
        path, key = shard.tensors[suffix]
        value: torch.Tensor = readers[path].get_tensor(key)
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{path}: tensor {key!r} has shape {list(value.shape)}, but the model's config "
                f"makes {shard.prefix} [{num_rows}, {in_features}], which {method} stores as "
                f"{list(shape)}"
            )
        if not _DTYPE_KINDS[kind](value.dtype):
            raise ValueError(f"{path}: tensor {key!r} has dtype {value.dtype}, expected {kind}")
        return value

    if method == "awq":
        codes = _awq_columns(_nibbles(read("qweight", (in_features, num_rows // 8), "int32"))).T
        zeros = _awq_columns(_nibbles(read("qzeros", (num_groups, num_rows // 8), "int32"))).T
        scales = read("scales", (num_groups, num_rows), "float").T
    elif method == "gptq":
        codes = _nibbles(read("qweight", (in_features // 8, num_rows), "int32").T)
        stored = _nibbles(read("qzeros", (num_groups, num_rows // 8), "int32")).T
        zeros = (stored + int4_format.zero_offset) & 15
        scales = read("scales", (num_groups, num_rows), "float").T
    else:
        shape = read("weight_shape", (2,), "int")
        if shape.tolist() != [num_rows, in_features]:
            path, key = shard.tensors["weight_shape"]
            raise ValueError(
                f"{path}: tensor {key!r} is {shape.tolist()}, but the model's config makes "
                f"{shard.prefix} [{num_rows}, {in_features}]"
            )
        codes = _nibbles(read("weight_packed", (num_rows, in_features // 8), "int32"))
        scales = read("weight_scale", (num_rows, num_groups), "float")
        zeros = _compressed_tensors_zeros(shard, readers, num_rows, num_groups)
    group_suffix = "g_idx" if method == "gptq" else "weight_g_idx"
    if group_suffix in shard.tensors:
        group_index = read(group_suffix, (in_features,), "int").long()
        _check_groups(group_index, group_size, shard.tensors[group_suffix])
    else:
        group_index = torch.arange(in_features) // group_size
    return Int4Weight(codes.contiguous(), scales.float(), zeros.float(), group_index)


def _compressed_tensors_zeros(
    shard: _Shard, readers: Mapping[Path, Any], num_rows: int, num_groups: int
) -> torch.Tensor:
    """Zero points [rows, groups] in the codes' unsigned scale: 8 for a symmetric scheme."""
    if "weight_zero_point" not in shard.tensors:
        return torch.full((num_rows, num_groups), 8.0)
    path, key = shard.tensors["weight_zero_point"]
    stored: torch.Tensor = readers[path].get_tensor(key)
    packed_shape = (-(-num_rows // 8), num_groups)
    if tuple(stored.shape) == packed_shape and stored.dtype == torch.int32:
        return _nibbles(stored.T)[:, :num_rows].T  # eight rows a word, each + 8
    if tuple(stored.shape) == (num_rows, num_groups) and not stored.is_floating_point():
        return stored.float() + 8  # NOTE: unpacked signed zero points (older writers)
    raise ValueError(
        f"{path}: tensor {key!r} has shape {list(stored.shape)} ({stored.dtype}), expected "
        f"{list(packed_shape)} int32 (packed) or [{num_rows}, {num_groups}] for {shard.prefix}"
    )


def _check_groups(group_index: torch.Tensor, group_size: int, where: tuple[Path, str]) -> None:
    """ValueError unless each group has exactly `group_size` columns (so sorting the columns by
    group makes runs of `group_size`, as GPTQ's act-order does)."""
    num_groups = len(group_index) // group_size
    in_range = bool(((group_index >= 0) & (group_index < num_groups)).all())
    if not in_range or bool(
        (torch.bincount(group_index, minlength=num_groups) != group_size).any()
    ):
        path, key = where
        raise ValueError(
            f"{path}: tensor {key!r} does not give each of the {num_groups} groups "
            f"{group_size} columns; the engine cannot load this act-order layout"
        )


def _input_order(group_index: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """The input columns sorted by group; None when they are in order already."""
    if torch.equal(group_index, torch.arange(len(group_index)) // group_size):
        return None
    return torch.sort(group_index, stable=True).indices


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 8 n] of int32 words [..., n]: value 8c + i is nibble i (bits 4i..4i+3) of
    word c. A shift at a time, so the temporaries are the size of `words`."""
    values = torch.empty(*words.shape, 8, dtype=torch.uint8)
    for i, shift in enumerate(_SHIFTS):
        values[..., i] = (words >> shift) & 15
    return values.flatten(-2)


def _awq_columns(values: torch.Tensor) -> torch.Tensor:
    """AWQ's packing order undone: [..., 8 n] values in their columns' order."""
    words = values.view(*values.shape[:-1], -1, 8)
    return words[..., list(_AWQ_COLUMNS)].flatten(-2)


def _read_bias(
    layer: _Layer, readers: Mapping[Path, Any], dtype: torch.dtype
) -> torch.Tensor | None:
    if layer.linear.bias is None:
        return None
    parts = []
    for shard in layer.filled_shards():
        assert shard.bias is not None  # _plan checked it
        path, key = shard.bias
        value: torch.Tensor = readers[path].get_tensor(key)
        if tuple(value.shape) != (shard.num_rows,):
            raise ValueError(
                f"{path}: tensor {key!r} has shape {list(value.shape)}, expected [{shard.num_rows}]"
            )
        parts.append(value)
    return torch.cat(parts).to(dtype)
