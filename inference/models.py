"""Model configurations edited in the admin; exactly one is active and served by the engine.

A configuration's engine fields are `EngineConfig`'s, under the same names, and default to its
defaults, except the few in `APP_DEFAULT_OVERRIDES`; the others (`APP_FIELDS`) belong to the app.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from chatsite.env import ConfigError, read_model_source
from inference.catalogue import CATALOGUE
from inference.engine import (
    SUPPORTED_MODEL_TYPES,
    EngineConfig,
    KVCacheSpec,
    check_draft_vocabulary,
    parse_dtype,
)
from inference.engine import ConfigError as EngineConfigError
from inference.engine_settings import engine_default, process_engine_settings
from inference.model_files import ModelNotPrepared, ModelSourceError, resolve_chat_model

# The fields that are not engine settings: which model to serve, the default sampling of chats,
# which configuration is active, and the row's own bookkeeping. Every other field is passed to
# EngineConfig under its own name (`ModelConfig.engine_config`).
APP_FIELDS = frozenset(
    {
        *("id", "name", "source", "draft_source"),
        *("temperature", "top_p", "top_k", "max_tokens"),
        *("is_active", "created_at", "updated_at"),
    }
)

# The app-level overrides: the engine fields whose default in the app is not EngineConfig's
# (a library default, for one engine in a script), because the app serves many chats at once.
APP_DEFAULT_OVERRIDES: dict[str, Any] = {
    # A chat turn carries its history and the retrieved passages.
    "max_model_len": 4096,
    # Many users' requests decode in one batch.
    "max_num_seqs": 32,
    # NOTE: on by default because it pays (docs/benchmarks.md): 3.9x (AMD EPYC) to 4.75x (Xeon
    # with AMX) on an answer that quotes its prompt, no loss on free text, and it steps aside
    # when more than 4 requests decode. EngineConfig's default stays 0 (off).
    "num_speculative_tokens": 5,
}


def default_for(name: str) -> Any:
    """The default of the engine field `name`: the app's override, else EngineConfig's."""
    if name in APP_DEFAULT_OVERRIDES:
        return APP_DEFAULT_OVERRIDES[name]
    return engine_default(name)


class ModelConfig(models.Model):
    """What the engine loads and how much work it takes on; sampling defaults for chats."""

    class Dtype(models.TextChoices):
        AUTO = "auto", _("auto (bfloat16 where the hardware has it, else float32)")
        BFLOAT16 = "bfloat16", "bfloat16"
        FLOAT32 = "float32", _("float32 (exact)")
        FLOAT16 = "float16", _("float16 (GPUs)")

    class Quantization(models.TextChoices):
        AUTO = (
            "auto",
            _(
                "auto (the checkpoint's own: a GGUF's 4-bit tensors int4, 5-8-bit int8; AWQ / GPTQ "
                "int4; else the dtype)"
            ),
        )
        NONE = "none", _("none (the dtype above)")
        INT8 = "int8", _("int8 (per channel, about half the weight memory)")
        INT4 = "int4", _("int4 (grouped, about a third of the weight memory)")

    class SpeculativeMethod(models.TextChoices):
        NGRAM = "ngram", _("n-gram prompt lookup (no second model)")
        DRAFT = "draft", _("draft model (the draft source below)")

    class KvCacheDtype(models.TextChoices):
        AUTO = "auto", _("auto (the model dtype)")
        INT8 = "int8", _("int8 (about half the KV memory per token)")

    name = models.CharField(_("name"), max_length=100, unique=True)
    source = models.CharField(
        _("source"),
        max_length=500,
        blank=True,
        help_text=_(
            "A model of the catalogue (listed by manage.py prepare_models --list), a Hugging Face "
            "id, a local model directory, or a .gguf file. Empty: the CACHET_MODEL setting "
            "(unset: the catalogue's default model)."
        ),
    )
    # --- Engine settings: EngineConfig's fields, by name. NOTE: clean() checks them with
    # EngineConfig's own checks; the validators here are only the admin's narrower limits.
    dtype = models.CharField(
        _("dtype"), max_length=16, choices=Dtype.choices, default=default_for("dtype")
    )
    max_model_len = models.PositiveIntegerField(
        _("max model len"),
        default=default_for("max_model_len"),
        validators=[MinValueValidator(64)],
        help_text=_("Prompt + answer tokens."),
    )
    kv_cache_mb = models.PositiveIntegerField(
        _("KV cache MB"),
        default=int(default_for("kv_cache_mb")),
        help_text=_("Memory for the paged KV cache."),
    )
    block_size = models.PositiveIntegerField(
        _("block size"), default=default_for("block_size"), validators=[MaxValueValidator(256)]
    )
    max_num_seqs = models.PositiveIntegerField(
        _("max num seqs"),
        default=default_for("max_num_seqs"),
        help_text=_("Requests decoded together."),
    )
    max_num_batched_tokens = models.PositiveIntegerField(
        _("max num batched tokens"),
        default=default_for("max_num_batched_tokens"),
        validators=[MinValueValidator(16)],
        help_text=_("Token budget of one engine step (decodes plus prefill chunks)."),
    )
    enable_prefix_caching = models.BooleanField(
        _("enable prefix caching"), default=default_for("enable_prefix_caching")
    )
    quantization = models.CharField(
        _("quantization"),
        max_length=8,
        choices=Quantization.choices,
        default=default_for("quantization"),
        help_text=_(
            "Weight formats: auto follows the checkpoint (a GGUF's tensors, an AWQ / GPTQ "
            "checkpoint's int4 layers); none, int8 and int4 apply to every layer (see "
            "docs/benchmarks.md)."
        ),
    )
    quantization_group_size = models.PositiveIntegerField(
        _("quantization group size"),
        default=default_for("quantization_group_size"),
        validators=[MinValueValidator(16)],
        help_text=_("int4 only: weights per scale (a power of two that divides every layer)."),
    )
    kv_cache_dtype = models.CharField(
        _("KV cache dtype"),
        max_length=8,
        choices=KvCacheDtype.choices,
        default=default_for("kv_cache_dtype"),
    )
    num_speculative_tokens = models.PositiveIntegerField(
        _("num speculative tokens"),
        default=default_for("num_speculative_tokens"),
        help_text=_(
            "Draft tokens per step (0: off), guessed by the speculative method below and checked "
            "by the model; in float32 answers are unchanged."
        ),
    )
    speculative_method = models.CharField(
        _("speculative method"),
        max_length=8,
        choices=SpeculativeMethod.choices,
        default=default_for("speculative_method"),
        help_text=_(
            "n-gram lookup speeds up answers that quote the prompt or the documents; a draft "
            "model of the same family speeds up any answer (docs/benchmarks.md)."
        ),
    )
    # NOTE: an app field, resolved into EngineConfig's draft_model_dir as `source` is into
    # model_dir (`engine_config`).
    draft_source = models.CharField(
        _("draft source"),
        max_length=500,
        blank=True,
        help_text=_(
            "The draft model (speculative method 'draft'): as the source above, and with the "
            "same tokenizer, e.g. qwen2.5-coder-0.5b-instruct for qwen2.5-coder-1.5b-instruct."
        ),
    )
    draft_kv_cache_mb = models.PositiveIntegerField(
        _("draft KV cache MB"),
        default=default_for("draft_kv_cache_mb"),
        null=True,
        blank=True,
        help_text=_("The draft model's own KV cache. Empty: as many tokens as the model's."),
    )
    draft_quantization = models.CharField(
        _("draft quantization"),
        max_length=8,
        choices=Quantization.choices,
        default=default_for("draft_quantization"),
        null=True,
        blank=True,
        help_text=_(
            "The draft model's weight formats. Empty: as the model's. int4 makes a draft faster "
            "where its checkpoint's own formats run layer by layer; answers are unchanged."
        ),
    )
    # --- App fields (APP_FIELDS): the default sampling of chats and the active flag.
    temperature = models.FloatField(
        _("temperature"), default=0.7, validators=[MinValueValidator(0.0), MaxValueValidator(2.0)]
    )
    top_p = models.FloatField(
        default=0.9, validators=[MinValueValidator(0.01), MaxValueValidator(1.0)]
    )
    top_k = models.PositiveIntegerField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(
        _("max tokens"), default=512, validators=[MinValueValidator(1)]
    )
    is_active = models.BooleanField(
        _("is active"),
        default=False,
        help_text=_("The engine serves the active configuration; only one is active."),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ["-is_active", "name"]
        verbose_name = _("model configuration")
        verbose_name_plural = _("model configurations")
        constraints = [
            models.UniqueConstraint(
                fields=["is_active"],
                condition=models.Q(is_active=True),
                name="one_active_model_config",
            )
        ]

    def __str__(self) -> str:
        if self.is_active:
            return gettext("%(name)s (active)") % {"name": self.name}
        return self.name

    @property
    def effective_source(self) -> str:
        return self.source.strip() or settings.CACHET_MODEL

    @classmethod
    def engine_field_names(cls) -> list[str]:
        """The fields that are engine settings, named as in EngineConfig: all but APP_FIELDS."""
        return [field.name for field in cls._meta.concrete_fields if field.name not in APP_FIELDS]

    def engine_settings(self) -> dict[str, Any]:
        """This configuration's engine settings, by their EngineConfig names."""
        return {name: getattr(self, name) for name in self.engine_field_names()}

    @property
    def uses_draft_model(self) -> bool:
        return self.speculative_method == self.SpeculativeMethod.DRAFT

    def engine_config(self, model_dir: Path, draft_model_dir: Path | None = None) -> EngineConfig:
        """The engine's settings for this configuration: the one place they are put together.

        `draft_model_dir`: the draft source's directory (the draft method only).
        ConfigError (the engine's, naming the setting) for a value the engine refuses.
        """
        return EngineConfig(
            model_dir=model_dir,
            draft_model_dir=draft_model_dir if self.uses_draft_model else None,
            **self.engine_settings(),
            **process_engine_settings(),
        )

    def clean(self) -> None:
        """Refuse a configuration the engine could not load, with the reason."""
        errors = self._engine_errors()
        try:
            model_dir = self._resolve_model_dir()
        except (ConfigError, ModelSourceError) as error:
            errors["source"] = str(getattr(error, "problem", error))
        else:
            if not errors:  # the checks against the model's files take valid settings
                errors |= self._check_against_model(model_dir)
            if self.uses_draft_model and not errors:
                errors |= self._draft_errors(model_dir)
        if errors:
            raise ValidationError(errors)

    def _engine_errors(self) -> dict[str, str]:
        """EngineConfig's own checks: their first error, under the field it names.

        NOTE: EngineConfig checks every setting except the model directories, which the loader
        checks (here `_resolve_model_dir`), so any directory stands in for them.
        """
        try:
            self.engine_config(model_dir=Path("."), draft_model_dir=Path("."))
        except EngineConfigError as error:
            message = str(error)
            # EngineConfig's messages start with the setting they are about.
            setting = message.split(" ", 1)[0]
            field = setting if setting in self.engine_field_names() else NON_FIELD_ERRORS
            return {field: message}
        return {}

    def _resolve_model_dir(self, field: str = "source") -> Path | None:
        """The model's directory, or None for a model that activation fetches or converts first.

        `field`: "draft_source" for the draft model's.
        """
        value = getattr(self, field).strip()
        source = self.effective_source if field == "source" else value
        if value:
            source = read_model_source({field: value}, field, catalogue=CATALOGUE) or ""
        try:
            return resolve_chat_model(
                source,
                settings.MODELS_DIR,
                may_prepare=False,
                model_cache=settings.CACHET_MODEL_CACHE,
            ).directory
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

    def _draft_errors(self, model_dir: Path | None) -> dict[str, str]:
        """The draft source's problems: missing, unknown, or not of the model's vocabulary."""
        if not self.draft_source.strip():
            return {"draft_source": "the speculative method 'draft' needs a draft model"}
        try:
            draft_dir = self._resolve_model_dir("draft_source")
        except (ConfigError, ModelSourceError) as error:
            return {"draft_source": str(getattr(error, "problem", error))}
        if model_dir is None or draft_dir is None:
            return {}  # activation prepares them first, and the engine checks them at load
        try:
            check_draft_vocabulary(
                _vocabulary(self.effective_source, model_dir),
                _vocabulary(self.draft_source.strip(), draft_dir),
            )
        except EngineConfigError as error:
            return {"draft_source": str(error).removeprefix("draft_model_dir ")}
        if self.draft_kv_cache_mb and self.max_model_len and self.block_size:
            needed_mb = self.min_kv_cache_mb(json.loads((draft_dir / "config.json").read_text()))
            if self.draft_kv_cache_mb < needed_mb:
                return {
                    "draft_kv_cache_mb": f"too small to hold one {self.max_model_len}-token "
                    f"sequence: needs at least {needed_mb} MB for the draft model and dtype"
                }
        return {}

    def kv_cache_spec(self, config: dict[str, Any]) -> KVCacheSpec:
        """The KV cache's block layout for the model of Hugging Face `config` (config.json)."""
        num_heads = config["num_attention_heads"]
        return KVCacheSpec(
            num_layers=config["num_hidden_layers"],
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            block_size=self.block_size,
            dtype=parse_dtype(self.dtype),
            cache_dtype=self.kv_cache_dtype or "auto",
        )

    def min_kv_cache_mb(self, config: dict[str, Any]) -> int:
        spec = self.kv_cache_spec(config)
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


def _vocabulary(name: str, model_dir: Path) -> tuple[str, Any, int]:
    """What the draft's vocabulary check reads of the model `name` prepared in `model_dir`."""
    from transformers import AutoTokenizer

    vocab_size = json.loads((model_dir / "config.json").read_text()).get("vocab_size", 0)
    return name, AutoTokenizer.from_pretrained(str(model_dir)), vocab_size
