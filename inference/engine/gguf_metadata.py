"""What a GGUF file says about its model, in transformers' terms: the config from its metadata
and the transformers name of each tensor; and where a model directory keeps its GGUF.

The names are llama.cpp's (gguf-py's tensor name maps); Gemma 3 calls its four norms differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
from transformers import AutoConfig
from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

from inference.engine.gguf_file import GGUFFile, GGUFFileError, StringArray

# The weights of a model directory prepared from a GGUF (inference/model_files.py): a link to it.
GGUF_WEIGHTS_FILE = "model.gguf"
# GGUF general.architecture -> transformers model_type, for the architectures the engine runs
GGUF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
# GGUF tensor names (per layer after "blk.N.", else whole) -> transformers' (without "model.")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_LAYER_NAMES = _LAYER_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_MODEL_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def find_gguf_weights(path: Path) -> Path | None:
    """The GGUF file holding the weights of `path`: itself when it is a .gguf file, a
    directory's model.gguf when it has no safetensors; None otherwise."""
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    weights = path / GGUF_WEIGHTS_FILE
    # NOTE: is_symlink too: a link to a file moved away must say so, not "no weights".
    if (weights.exists() or weights.is_symlink()) and not any(path.glob("*.safetensors")):
        return weights
    return None


def read_hf_config(gguf: GGUFFile) -> Any:
    """The transformers config of a GGUF file, from its metadata (transformers' own key names).

    NOTE: the same config as `AutoConfig.from_pretrained(folder, gguf_file=name)` (tested), which
    parses the vocabulary and merges too: 20 to 80 s on this machine against 0.1 s.
    """
    architecture = gguf.architecture
    model_type = GGUF_MODEL_TYPES.get(architecture)
    if model_type is None:
        raise GGUFFileError(
            f"{gguf.path}: architecture {architecture!r} is not supported by the engine; "
            f"supported: {', '.join(GGUF_MODEL_TYPES)}"
        )
    mapping = cast("dict[str, dict[str, Any]]", GGUF_TO_TRANSFORMERS_MAPPING["config"])
    sections = {section: mapping[section] for section in ("general", "tokenizer", architecture)}
    values: dict[str, Any] = {}
    for key, value in gguf.metadata.items():
        section, _, name = key.partition(".")
        hf_name = sections.get(section, {}).get(name)
        if hf_name is None or hf_name == -1 or isinstance(value, StringArray):
            continue
        values[hf_name] = value.tolist() if isinstance(value, np.ndarray) else value
    values.pop("model_type", None)
    # NOTE: transformers' rules: a file without output.weight ties the embeddings; the
    # vocabulary size, when the metadata has none, is the tokenizer's.
    values["tie_word_embeddings"] = "output.weight" not in gguf.tensors
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in values and isinstance(tokens, StringArray):
        values["vocab_size"] = tokens.count
    try:
        return AutoConfig.for_model(model_type, **values)
    except (TypeError, ValueError) as error:
        raise GGUFFileError(f"{gguf.path}: its metadata is not a valid config: {error}") from None


def hf_name_of(gguf_name: str, architecture: str) -> str | None:
    """transformers' parameter name (without "model.") of a GGUF tensor; None if unknown."""
    base, dot, suffix = gguf_name.rpartition(".")
    if not dot or suffix not in ("weight", "bias"):
        return None
    parts = base.split(".")
    if len(parts) == 1 and parts[0] in _MODEL_NAMES:
        return f"{_MODEL_NAMES[parts[0]]}.{suffix}"
    layer_names = _GEMMA3_LAYER_NAMES if architecture == "gemma3" else _LAYER_NAMES
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_names:
        return f"layers.{parts[1]}.{layer_names[parts[2]]}.{suffix}"
    return None
