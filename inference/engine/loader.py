"""Building a `LlamaForCausalLM` from a Hugging Face model directory.

Reads config.json and every *.safetensors file (one or many shards), maps checkpoint names onto
our parameters (q/k/v into `qkv_proj`, gate/up into `gate_up_proj`) and casts to the requested
dtype while copying, so a float32 checkpoint never exists twice in memory.
"""

from __future__ import annotations

import json
import logging
import time
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

from inference.engine.models.llama import LlamaArgs, LlamaForCausalLM

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
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


@dataclass(slots=True)
class LoadedModel:
    model: LlamaForCausalLM
    hf_config: Any  # transformers.PretrainedConfig


def load_hf_config(model_dir: str | Path) -> Any:
    """The transformers config of `model_dir`; ValueError if its architecture is unsupported."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{model_dir} has no config.json: not a Hugging Face model directory")
    # NOTE: checked on the raw JSON first so an unknown architecture gets our message, not
    # whatever transformers says about a model type it may not know either.
    model_type = json.loads(config_path.read_text()).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported by the engine; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return AutoConfig.from_pretrained(model_dir)


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    native_kernels: bool = True,
) -> LoadedModel:
    """The model of `model_dir` in `dtype` on `device` (`native_kernels`: see LlamaForCausalLM)."""
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype} is not supported; use one of {SUPPORTED_DTYPES}")
    model_dir = Path(model_dir)
    started = time.perf_counter()
    hf_config = load_hf_config(model_dir)
    args = LlamaArgs.from_hf_config(hf_config)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} has no *.safetensors weights")

    # NOTE: built on the meta device: real storage comes from the checkpoint, so nothing is
    # randomly initialised only to be overwritten.
    with torch.device("meta"):
        model = LlamaForCausalLM(args, native_kernels=native_kernels)
    params = {
        name: torch.empty(p.shape, dtype=dtype, device=device)
        for name, p in model.named_parameters()
    }
    shard_offsets = _shard_offsets(args)
    # parameter name -> shards still to copy (3 for qkv_proj, 2 for gate_up_proj, else 1)
    missing = {name: len(shard_offsets.get(name.split(".")[-2], [None])) for name in params}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                target = _param_name(key, args)
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
                        f"checkpoint weight {key!r} has shape {tuple(tensor.shape)}, "
                        f"expected {tuple(dest.shape)}"
                    )
                dest.copy_(tensor)
                missing[name] -= 1
    not_loaded = sorted(name for name, count in missing.items() if count > 0)
    if not_loaded:
        raise ValueError(f"{model_dir} is missing weights: {', '.join(not_loaded[:10])}")

    model.load_state_dict(params, strict=False, assign=True)
    model.to(device)
    model.requires_grad_(False)
    model.eval()
    logger.info(
        "loaded %s (%s, %d layers) as %s in %.1f s",
        model_dir.name,
        hf_config.model_type,
        args.num_layers,
        dtype,
        time.perf_counter() - started,
    )
    return LoadedModel(model=model, hf_config=hf_config)


def _shard_offsets(args: LlamaArgs) -> dict[str, list[tuple[int, int]]]:
    """(offset, size) along the output dimension of each shard of the fused parameters."""
    q_size = args.num_heads * args.head_dim
    kv_size = args.num_kv_heads * args.head_dim
    inter = args.intermediate_size
    return {
        "qkv_proj": [(0, q_size), (q_size, kv_size), (q_size + kv_size, kv_size)],
        "gate_up_proj": [(0, inter), (inter, inter)],
    }


def _param_name(key: str, args: LlamaArgs) -> tuple[str, int | None] | None:
    """Our parameter name and fused-shard index for checkpoint `key`; None to skip it."""
    if key.endswith(_IGNORED_SUFFIXES):
        return None
    name = key.removeprefix("model.")
    if name == "lm_head.weight" and args.tie_word_embeddings:
        # NOTE: some tied checkpoints store a copy of the embedding; it is the same matrix.
        return None
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _FUSED_SHARDS:
        fused, shard = _FUSED_SHARDS[parts[-2]]
        parts[-2] = fused
        return ".".join(parts), shard
    return name, None
