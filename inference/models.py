"""Model configurations edited in the admin; exactly one is active and served by the engine."""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction

from chatsite.env import ConfigError, read_model_source
from inference.engine import (
    DEFAULT_INT4_GROUP_SIZE,
    MAX_SPECULATIVE_TOKENS,
    SUPPORTED_MODEL_TYPES,
    KVCacheSpec,
    check_quantization,
    parse_dtype,
)
from inference.model_files import ModelNotPrepared, ModelSourceError, resolve_chat_model

DEFAULT_SPECULATIVE_TOKENS = 5  # the app's default; EngineConfig's stays 0 (off)


class ModelConfig(models.Model):
    """What the engine loads and how much work it takes on; sampling defaults for chats."""

    class Dtype(models.TextChoices):
        AUTO = "auto", "auto (bfloat16 where the hardware has it, else float32)"
        BFLOAT16 = "bfloat16", "bfloat16"
        FLOAT32 = "float32", "float32 (exact)"
        FLOAT16 = "float16", "float16 (GPUs)"

    class Quantization(models.TextChoices):
        NONE = "none", "none (the dtype above)"
        INT8 = "int8", "int8 (per channel, about half the weight memory)"
        INT4 = "int4", "int4 (grouped, about a third of the weight memory)"

    class KvCacheDtype(models.TextChoices):
        AUTO = "auto", "auto (the model dtype)"
        INT8 = "int8", "int8 (about half the KV memory per token)"

    name = models.CharField(max_length=100, unique=True)
    source = models.CharField(
        max_length=500,
        blank=True,
        help_text="Hugging Face id, local model directory, or .gguf file. "
        "Empty: the CACHET_MODEL setting (by default the bundled SmolLM2-135M-Instruct).",
    )
    dtype = models.CharField(max_length=16, choices=Dtype.choices, default=Dtype.AUTO)
    max_model_len = models.PositiveIntegerField(
        default=4096, validators=[MinValueValidator(64)], help_text="Prompt + answer tokens."
    )
    kv_cache_mb = models.PositiveIntegerField(
        default=512, validators=[MinValueValidator(1)], help_text="Memory for the paged KV cache."
    )
    block_size = models.PositiveIntegerField(
        default=16, validators=[MinValueValidator(1), MaxValueValidator(256)]
    )
    max_num_seqs = models.PositiveIntegerField(
        default=32, validators=[MinValueValidator(1)], help_text="Requests decoded together."
    )
    max_num_batched_tokens = models.PositiveIntegerField(
        default=512,
        validators=[MinValueValidator(16)],
        help_text="Token budget of one engine step (decodes plus prefill chunks).",
    )
    enable_prefix_caching = models.BooleanField(default=True)
    quantization = models.CharField(
        max_length=8,
        choices=Quantization.choices,
        default=Quantization.NONE,
        help_text="Weight-only quantization applied after loading (see docs/benchmarks.md).",
    )
    quantization_group_size = models.PositiveIntegerField(
        default=DEFAULT_INT4_GROUP_SIZE,
        validators=[MinValueValidator(16)],
        help_text="int4 only: weights per scale (a power of two that divides every layer).",
    )
    kv_cache_dtype = models.CharField(
        max_length=8,
        choices=KvCacheDtype.choices,
        default=KvCacheDtype.AUTO,
        verbose_name="KV cache dtype",
    )
    # NOTE: on by default because it pays (docs/benchmarks.md): 3.9x (AMD EPYC) to 4.75x (Xeon
    # with AMX) on an answer that quotes its prompt, no loss on free text, and it steps aside
    # when more than 4 requests decode.
    num_speculative_tokens = models.PositiveIntegerField(
        default=DEFAULT_SPECULATIVE_TOKENS,
        validators=[MaxValueValidator(MAX_SPECULATIVE_TOKENS)],
        help_text="Draft tokens per step from n-gram prompt lookup (0: off). It speeds up "
        "answers that quote the prompt or the documents; in float32 answers are unchanged.",
    )
    temperature = models.FloatField(
        default=0.7, validators=[MinValueValidator(0.0), MaxValueValidator(2.0)]
    )
    top_p = models.FloatField(
        default=0.9, validators=[MinValueValidator(0.01), MaxValueValidator(1.0)]
    )
    top_k = models.PositiveIntegerField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(default=512, validators=[MinValueValidator(1)])
    is_active = models.BooleanField(
        default=False, help_text="The engine serves the active configuration; only one is active."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-is_active", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_active"],
                condition=models.Q(is_active=True),
                name="one_active_model_config",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name}{' (active)' if self.is_active else ''}"

    @property
    def effective_source(self) -> str | None:
        return self.source.strip() or settings.CACHET_MODEL

    def clean(self) -> None:
        """Refuse a configuration the engine could not load, with the reason."""
        errors: dict[str, str] = {}
        if (
            self.max_num_batched_tokens
            and self.max_num_seqs
            and (self.max_num_batched_tokens < self.max_num_seqs)
        ):
            errors["max_num_batched_tokens"] = (
                "must be at least max_num_seqs, so every running request can decode each step"
            )
        if self.quantization and self.quantization_group_size:
            try:
                check_quantization(self.quantization, self.quantization_group_size)
            except ValueError as error:
                errors["quantization_group_size"] = str(error)
        try:
            model_dir = self._resolve_model_dir()
        except (ConfigError, ModelSourceError) as error:
            errors["source"] = str(getattr(error, "problem", error))
        else:
            errors |= self._check_against_model(model_dir)
        if errors:
            raise ValidationError(errors)

    def _resolve_model_dir(self) -> Path | None:
        """The model's directory, or None for a GGUF that activation will convert first."""
        source = self.effective_source
        if self.source.strip():
            source = read_model_source({"source": self.source}, "source")
        try:
            return resolve_chat_model(source, settings.MODELS_DIR, may_prepare=False).directory
        except ModelNotPrepared:
            return None

    def _check_against_model(self, model_dir: Path | None) -> dict[str, str]:
        if model_dir is None:
            return {}
        config = json.loads((model_dir / "config.json").read_text())
        model_type = config.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            return {
                "source": f"model type {model_type!r} is not supported; "
                f"supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
            }
        errors = {}
        max_positions = config.get("max_position_embeddings")
        if max_positions and self.max_model_len and self.max_model_len > max_positions:
            errors["max_model_len"] = f"the model supports at most {max_positions} positions"
        if self.kv_cache_mb and self.max_model_len and self.block_size:
            needed_mb = self.min_kv_cache_mb(config)
            if self.kv_cache_mb < needed_mb:
                errors["kv_cache_mb"] = (
                    f"too small to hold one {self.max_model_len}-token sequence: "
                    f"needs at least {needed_mb} MB for this model and dtype"
                )
        return errors

    def min_kv_cache_mb(self, config: dict) -> int:
        num_heads = config["num_attention_heads"]
        spec = KVCacheSpec(
            num_layers=config["num_hidden_layers"],
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            block_size=self.block_size,
            dtype=parse_dtype(self.dtype),
            cache_dtype=self.kv_cache_dtype or "auto",
        )
        num_blocks = -(-self.max_model_len // self.block_size)
        return -(-num_blocks * spec.bytes_per_block // (1024 * 1024))

    def activate(self) -> None:
        """Make this the one active configuration (the caller reloads the engine)."""
        with transaction.atomic():
            ModelConfig.objects.filter(is_active=True).exclude(pk=self.pk).update(is_active=False)
            self.is_active = True
            self.save()

    @classmethod
    def active(cls) -> ModelConfig | None:
        return cls.objects.filter(is_active=True).first()
