"""Per-engine prompt builders and the sampling settings of a chat turn."""

from __future__ import annotations

import secrets
import threading
import weakref

from django.conf import settings

from chat.models import AssistantProfile
from inference.engine import Engine, SamplingParams
from inference.models import ModelConfig
from inference.prompts import PromptBuilder

_builders: weakref.WeakKeyDictionary[Engine, dict[str, PromptBuilder]] = weakref.WeakKeyDictionary()
_builders_lock = threading.Lock()
MAX_BUILDERS_PER_ENGINE = 64


def prompt_builder_for(engine: Engine, system_prompt: str) -> PromptBuilder:
    """A builder for this engine's tokenizer and context, kept per system prompt."""
    with _builders_lock:
        builders = _builders.setdefault(engine, {})
        builder = builders.get(system_prompt)
        if builder is None:
            if len(builders) >= MAX_BUILDERS_PER_ENGINE:
                builders.pop(next(iter(builders)))
            builder = PromptBuilder(
                engine.tokenizer,
                system_prompt,
                max_model_len=engine.max_model_len,
                tokenizer_lock=engine.tokenizer_lock,
            )
            builders[system_prompt] = builder
        return builder


def cache_salt_for(user) -> str | None:
    """The prefix-cache salt of `user`'s requests: None shares cached blocks between users."""
    if settings.CACHET_CACHE_ISOLATION == "user":
        return f"user:{user.pk}"
    return None


def sampling_params_for(
    profile: AssistantProfile, model_config: ModelConfig, *, seed: int | None = None
) -> SamplingParams:
    """The profile's sampling settings, falling back to the model configuration's defaults."""

    def pick(name: str):
        value = getattr(profile, name)
        return getattr(model_config, name) if value is None else value

    return SamplingParams(
        temperature=pick("temperature"),
        top_p=pick("top_p"),
        top_k=pick("top_k"),
        max_tokens=pick("max_tokens"),
        # NOTE: a seed per answer, saved with it, makes every answer reproducible.
        seed=secrets.randbelow(2**31) if seed is None else seed,
    )
