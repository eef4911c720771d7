"""Building the engine's model (models/registry.py) from a Hugging Face model directory or a
GGUF checkpoint.

Reads config.json and every *.safetensors file (one or many shards), maps checkpoint names onto
our parameters (q/k/v into `qkv_proj`, gate/up into `gate_up_proj`) and casts to the requested
dtype while copying, so a float32 checkpoint never exists twice in memory. A GGUF's tensors go
through the same names into the engine's quantized formats (gguf_checkpoint.py), and so do the
int4 layers of an AWQ, GPTQ or compressed-tensors checkpoint (quantized_checkpoint.py). Every load
reports its time, peak memory and weight bytes (load_report.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import logging
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

# NOTE: imported here, on the thread that imports the engine (Django's start-up), not inside the
# engine thread: transformers' lazy module is not safe to materialise from two threads at once, and
# the engine thread loads its model while other start-up threads import transformers too
# (retrieval's tokenizer). That race failed start-ups with "cannot import name 'AutoConfig'".
from transformers import AutoConfig

from inference.engine.gguf_checkpoint import load_gguf_weights
from inference.engine.gguf_file import open_gguf
from inference.engine.gguf_metadata import find_gguf_weights, read_hf_config
from inference.engine.layers.quantization import (
    DEFAULT_INT4_GROUP_SIZE,
    model_weight_bytes,
    quantize_model,
    weight_formats,
)
from inference.engine.load_report import LoadMeter, LoadReport
from inference.engine.models.causal_lm import CausalLM, DecoderArgs
from inference.engine.models.registry import architecture_of
from inference.engine.quantized_checkpoint import load_int4_layers, read_int4_format

logger = logging.getLogger(__name__)

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# checkpoint projection name -> (our fused parameter, shard index inside it)
_FUSED_SHARDS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# Checkpoint entries that are not weights (old transformers saved the RoPE table).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# The image side of multimodal checkpoints (Gemma 3 4B+), whose text decoder is the model.
_IGNORED_PREFIXES = tuple(
    f"{prefix}{part}"
    for prefix in ("", "model.")
    for part in ("vision_tower.", "multi_modal_projector.")
)


@dataclass(slots=True)
class LoadedModel:
    model: CausalLM
    hf_config: Any  # transformers.PretrainedConfig
    report: LoadReport


def load_hf_config(model_dir: str | Path) -> Any:
    """The transformers config of `model_dir`; ValueError if its architecture is unsupported."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{model_dir} has no config.json: not a Hugging Face model directory")
    # NOTE: checked on the raw JSON first so an unknown architecture gets our message, not
    # whatever transformers says about a model type it may not know either.
    architecture_of(json.loads(config_path.read_text()).get("model_type"))
    return AutoConfig.from_pretrained(model_dir)


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    native_kernels: bool = True,
    quantization: str = "none",
    quantization_group_size: int = DEFAULT_INT4_GROUP_SIZE,
) -> LoadedModel:
    """The model of `model_dir` in `dtype` on `device` (`native_kernels`: see LlamaForCausalLM),
    its weights in `quantization`'s formats.

    `model_dir`: a Hugging Face directory (safetensors), a GGUF file, or a directory whose
    weights are its model.gguf (inference/model_files.py prepares those). A GGUF loads straight
    into the engine's formats (gguf_checkpoint.py: "auto" keeps its tensors' precision); a
    safetensors checkpoint loads in `dtype` and is then quantized (quantization.py; "auto" is
    "none" for it). An AWQ / GPTQ / compressed-tensors int4 checkpoint's int4 layers keep their
    codes under "auto" and "int4" (quantized_checkpoint.py: "none" dequantizes them, "int8"
    requantizes them), its float tensors load as a safetensors checkpoint's.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype} is not supported; use one of {SUPPORTED_DTYPES}")
    model_dir = Path(model_dir)
    meter = LoadMeter()
    gguf_path = find_gguf_weights(model_dir)
    # NOTE: resolved, so errors and the report name the GGUF itself, not a directory's link to it
    gguf = None if gguf_path is None else open_gguf(gguf_path.resolve())
    if gguf is not None and model_dir.is_file():
        hf_config = read_hf_config(gguf)
    else:
        hf_config = load_hf_config(model_dir)
    architecture = architecture_of(hf_config.model_type)
    args = architecture.read_args(hf_config)
    # NOTE: built on the meta device: real storage comes from the checkpoint, so nothing is
    # randomly initialised only to be overwritten.
    with torch.device("meta"):
        model = architecture(args, native_kernels=native_kernels)
    if gguf is not None:
        load_gguf_weights(
            model,
            gguf,
            param_name=lambda key: _param_name(key, args),
            shard_offsets=_shard_offsets(args),
            dtype=dtype,
            quantization=quantization,
            group_size=quantization_group_size,
            native_kernels=native_kernels,
        )
        checkpoint_format, checkpoint_bytes = "gguf", gguf.tensor_bytes
        del gguf  # NOTE: unmaps the file (nothing built refers to its pages)
    else:
        int4_format = read_int4_format(model_dir / "config.json")
        int4_keys: set[str] = set()
        if int4_format is not None:
            int4_keys = load_int4_layers(
                model,
                sorted(model_dir.glob("*.safetensors")),
                int4_format,
                param_name=lambda key: _param_name(key, args),
                shard_offsets=_shard_offsets(args),
                dtype=dtype,
                quantization=quantization,
                native_kernels=native_kernels,
            )
        checkpoint_bytes = _load_safetensors(model, model_dir, args, dtype, device, skip=int4_keys)
        checkpoint_format = "safetensors"
        model = quantize_model(
            model,
            "none" if quantization == "auto" else quantization,
            quantization_group_size,
            native_kernels=native_kernels,
        )
    model.to(device)
    model.requires_grad_(False)
    model.eval()
    return_freed_memory()
    report = meter.finish(
        model_dir if gguf_path is None else gguf_path.resolve(),
        checkpoint_format,
        weight_bytes=model_weight_bytes(model),
        checkpoint_bytes=checkpoint_bytes,
        formats=weight_formats(model),
    )
    logger.info(
        "loaded %s (%s, %d layers) as %s",
        model_dir.name,
        hf_config.model_type,
        args.num_layers,
        dtype,
    )
    return LoadedModel(model=model, hf_config=hf_config, report=report)


def return_freed_memory() -> None:
    """Free what reference cycles hold, then hand the free heap back to the system.

    NOTE: a load leaves garbage in cycles: torch imports its compiler lazily, on the first
    weight initialised on the meta device, and torch.fx's `wrap` leaves that import's frames in
    a cycle whose frames reach the loading thread's own. Left to Python's next full collection,
    they held the first engine of a process (weights, KV cache) after its shutdown. And glibc
    keeps the heap that a load's temporaries freed (~150 MB after a GGUF's chunks of rows);
    malloc_trim hands it back (a no-op without glibc)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _load_safetensors(
    model: CausalLM,
    model_dir: Path,
    args: DecoderArgs,
    dtype: torch.dtype,
    device: Any,
    skip: Container[str] = (),
) -> int:
    """Fill `model` from every *.safetensors file of `model_dir` but the keys in `skip` (int4
    layers already built); returns the files' bytes."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} has no *.safetensors weights")
    # NOTE: only those still on the meta device: a dequantized int4 layer ("none") has its own.
    params = {
        name: torch.empty(p.shape, dtype=dtype, device=device)
        for name, p in model.named_parameters()
        if p.is_meta
    }
    shard_offsets = _shard_offsets(args)
    # parameter name -> shards still to copy (3 for qkv_proj, 2 for gate_up_proj, else 1)
    missing = {name: len(shard_offsets.get(name.split(".")[-2], [None])) for name in params}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                target = None if key in skip else _param_name(key, args)
                if target is None:
                    continue
                name, shard = target
                if name not in params:
                    raise ValueError(
                        f"checkpoint weight {key!r} in {path.name} has no place in the model"
                    )
                dest = params[name]
                if shard is not None:
                    offset, size = shard_offsets[name.split(".")[-2]][shard]
                    dest = dest.narrow(0, offset, size)
                tensor = f.get_tensor(key)
                if tensor.shape != dest.shape:
                    raise ValueError(
                        f"checkpoint weight {key!r} in {path.name} has shape "
                        f"{tuple(tensor.shape)}, expected {tuple(dest.shape)}"
                    )
                dest.copy_(tensor)
                missing[name] -= 1
    not_loaded = sorted(name for name, count in missing.items() if count > 0)
    if not_loaded:
        raise ValueError(f"{model_dir} is missing weights: {', '.join(not_loaded[:10])}")
    model.load_state_dict(params, strict=False, assign=True)
    return sum(path.stat().st_size for path in files)


def _shard_offsets(args: DecoderArgs) -> dict[str, list[tuple[int, int]]]:
    """(offset, size) along the output dimension of each shard of the fused parameters."""
    q_size = args.num_heads * args.head_dim
    kv_size = args.num_kv_heads * args.head_dim
    inter = args.intermediate_size
    return {
        "qkv_proj": [(0, q_size), (q_size, kv_size), (q_size + kv_size, kv_size)],
        "gate_up_proj": [(0, inter), (inter, inter)],
    }


def _param_name(key: str, args: DecoderArgs) -> tuple[str, int | None] | None:
    """Our parameter name and fused-shard index for checkpoint `key`; None to skip it."""
    if key.endswith(_IGNORED_SUFFIXES) or key.startswith(_IGNORED_PREFIXES):
        return None
    name = key.removeprefix("model.").removeprefix("language_model.").removeprefix("model.")
    if name == "lm_head.weight" and args.tie_word_embeddings:
        # NOTE: some tied checkpoints store a copy of the embedding; it is the same matrix.
        return None
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _FUSED_SHARDS:
        fused, shard = _FUSED_SHARDS[parts[-2]]
        parts[-2] = fused
        return ".".join(parts), shard
    return name, None
