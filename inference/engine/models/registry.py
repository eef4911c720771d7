"""The architectures the engine runs, by transformers' `model_type`: the one list of them."""

from __future__ import annotations

from inference.engine.models.causal_lm import CausalLM
from inference.engine.models.gemma3 import Gemma3ForCausalLM
from inference.engine.models.llama import LlamaForCausalLM

ARCHITECTURES: dict[str, type[CausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
    # NOTE: text-only Gemma 3 checkpoints (270M, 1B) say gemma3_text; the multimodal ones say
    # gemma3 and nest the decoder's settings in text_config (see Gemma3Args.from_hf_config).
    "gemma3_text": Gemma3ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)


def architecture_of(model_type: str | None) -> type[CausalLM]:
    """The model class for `model_type`; ValueError naming the supported ones otherwise."""
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"model_type {model_type!r} is not supported by the engine; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return ARCHITECTURES[model_type]
