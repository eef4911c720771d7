"""Admin for API keys: make one (its value is shown once), set its limits, see its usage, revoke."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from api.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "user",
        "prefix_display",
        "is_active",
        "requests_per_minute_display",
        "tokens_per_minute_display",
        "num_requests",
        "num_prompt_tokens",
        "num_completion_tokens",
        "last_used_at",
        "created_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    list_select_related = ("user",)
    search_fields = ("name", "prefix", "user__username")
    actions = ("revoke_selected",)
    # NOTE: key_hash is never shown: it is not secret, but nothing needs it and it invites misuse.
    readonly_fields = (
        "prefix_display",
        "is_active",
        "revoked_at",
        "created_at",
        "last_used_at",
        "num_requests",
        "num_prompt_tokens",
        "num_completion_tokens",
    )
    add_fieldsets = (
        (None, {"fields": ("user", "name")}),
        (_("Limits"), {"fields": ("requests_per_minute", "tokens_per_minute")}),
    )
    fieldsets = (
        (None, {"fields": ("user", "name", "prefix_display", "is_active", "revoked_at")}),
        (_("Limits"), {"fields": ("requests_per_minute", "tokens_per_minute")}),
        (
            _("Usage"),
            {
                "fields": (
                    "num_requests",
                    "num_prompt_tokens",
                    "num_completion_tokens",
                    "last_used_at",
                    "created_at",
                )
            },
        ),
    )

    def get_fieldsets(self, request: HttpRequest, obj: ApiKey | None = None):
        return self.add_fieldsets if obj is None else self.fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None):
        if obj is None:
            return ()
        # A key keeps its owner: give another user their own key instead.
        return ("user", *self.readonly_fields)

    @admin.display(description=_("prefix"), ordering="prefix")
    def prefix_display(self, api_key: ApiKey) -> str:
        return f"{api_key.prefix}…"

    @admin.display(description=_("active"), boolean=True)
    def is_active(self, api_key: ApiKey) -> bool:
        return api_key.is_active

    @admin.display(description=_("requests/min"), ordering="requests_per_minute")
    def requests_per_minute_display(self, api_key: ApiKey) -> str:
        if api_key.requests_per_minute is None:
            return _with_default_note(api_key.effective_requests_per_minute)
        return str(api_key.requests_per_minute)

    @admin.display(description=_("tokens/min"), ordering="tokens_per_minute")
    def tokens_per_minute_display(self, api_key: ApiKey) -> str:
        if api_key.tokens_per_minute is None:
            return _with_default_note(api_key.effective_tokens_per_minute)
        return str(api_key.tokens_per_minute)

    def save_model(self, request: HttpRequest, obj: ApiKey, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # NOTE: the plaintext lives only in this message (one page view); only its hash is kept.
        raw = obj.set_new_key()
        super().save_model(request, obj, form, change)
        self.message_user(
            request,
            gettext("Copy this key now, it will not be shown again: %(key)s") % {"key": raw},
            messages.SUCCESS,
        )

    @admin.action(description=_("Revoke selected keys"))
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        message = ngettext("Revoked %(count)d key.", "Revoked %(count)d keys.", count)
        self.message_user(request, message % {"count": count}, messages.SUCCESS)


def _with_default_note(limit: int) -> str:
    """A limit that comes from the setting, marked as the default."""
    return gettext("%(limit)d (default)") % {"limit": limit}
