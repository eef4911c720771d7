"""Admin for model configurations: edit, validate, and activate (which reloads the engine)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Field, QuerySet
from django.forms import Field as FormField
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from inference import runtime
from inference.models import ModelConfig
from inference.widgets import CatalogueSourceInput


@admin.register(ModelConfig)
class ModelConfigAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "is_active",
        "source_display",
        "dtype",
        "max_model_len",
        "kv_cache_mb",
        "max_num_seqs",
        "quantization",
        "updated_at",
    )
    list_filter = ("is_active", "dtype", "quantization")
    search_fields = ("name", "source")
    readonly_fields = ("is_active", "created_at", "updated_at")
    actions = ("activate_selected",)
    fieldsets = (
        (None, {"fields": ("name", "source", "is_active")}),
        (
            _("Engine"),
            {
                "fields": (
                    "dtype",
                    "max_model_len",
                    "kv_cache_mb",
                    "block_size",
                    "max_num_seqs",
                    "max_num_batched_tokens",
                    "enable_prefix_caching",
                ),
                "description": _(
                    "EngineConfig's settings, by the same names (inference/engine/config.py)."
                ),
            },
        ),
        (
            _("Speed"),
            {
                "fields": (
                    "quantization",
                    "quantization_group_size",
                    "kv_cache_dtype",
                    "num_speculative_tokens",
                    "speculative_method",
                    "draft_kv_cache_mb",
                    "draft_quantization",
                ),
                "description": _("What each option buys on this machine: docs/benchmarks.md."),
            },
        ),
        (
            _("Draft model"),
            {
                "fields": ("draft_source",),
                "description": _(
                    "For the speculative method 'draft': a small model with the same tokenizer "
                    "guesses the next tokens, the model above checks them."
                ),
            },
        ),
        (
            _("Default sampling"),
            {
                "fields": ("temperature", "top_p", "top_k", "max_tokens"),
                "description": _(
                    "App settings, not the engine's: the defaults of a chat's sampling."
                ),
            },
        ),
        (_("History"), {"fields": ("created_at", "updated_at")}),
    )

    @admin.display(description=_("source"))
    def source_display(self, config: ModelConfig) -> str:
        return config.source or gettext("(default: %(model)s)") % {"model": settings.CACHET_MODEL}

    def formfield_for_dbfield(
        self, db_field: Field[Any, Any], request: HttpRequest, **kwargs: Any
    ) -> FormField | None:
        if db_field.name in ("source", "draft_source"):
            kwargs["widget"] = CatalogueSourceInput(attrs={"class": "vTextField"})
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def save_model(
        self, request: HttpRequest, obj: ModelConfig, form: ModelForm[ModelConfig], change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        if obj.is_active:
            # NOTE: editing the active configuration changes what the engine should run.
            self._reload(request, obj)

    @admin.action(description=_("Activate the selected configuration (reloads the engine)"))
    def activate_selected(self, request: HttpRequest, queryset: QuerySet[ModelConfig]) -> None:
        if queryset.count() != 1:
            self.message_user(request, gettext("Select exactly one configuration."), messages.ERROR)
            return
        config = queryset.get()
        try:
            config.full_clean()
        except ValidationError as error:
            self.message_user(
                request,
                gettext("Not activated: %(errors)s") % {"errors": error.messages},
                messages.ERROR,
            )
            return
        config.activate()
        self._reload(request, config)

    def _reload(self, request: HttpRequest, config: ModelConfig) -> None:
        runtime.reload_engine(config)
        self.message_user(
            request,
            gettext(
                "Loading %(name)s; requests in flight finish on the previous engine. "
                "See /healthz for progress."
            )
            % {"name": repr(config.name)},
            messages.SUCCESS,
        )
