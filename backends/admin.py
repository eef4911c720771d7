"""Admin for remote inference backends: URL, key, model, weight, health, and a health check.

The API key is write-only here: the form never shows it back (leave it empty to keep it), and no
list or page displays it, only whether one is set.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from backends.health import check_and_record
from backends.models import InferenceBackend


class InferenceBackendForm(forms.ModelForm):
    # NOTE: inference servers inside a cluster are often plain http; an address typed without a
    # scheme means that, not https.
    base_url = forms.URLField(
        max_length=500,
        assume_scheme="http",
        label=InferenceBackend._meta.get_field("base_url").verbose_name,
        help_text=InferenceBackend._meta.get_field("base_url").help_text,
    )
    api_key = forms.CharField(
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        label=_("API key"),
        help_text=_("Sent as 'Authorization: Bearer <key>'. Leave empty to keep the current key."),
    )
    clear_api_key = forms.BooleanField(
        required=False, label=_("Clear API key"), help_text=_("Remove the stored key.")
    )

    class Meta:
        model = InferenceBackend
        fields = (
            "name",
            "base_url",
            "api_key",
            "model",
            "weight",
            "is_enabled",
            "takes_complex_requests",
        )

    def clean_api_key(self) -> str:
        key = self.cleaned_data.get("api_key", "")
        if not key and self.instance.pk is not None:
            return self.instance.api_key  # NOTE: empty means "unchanged", never "erase"
        if key and len(key.split()) > 1:
            raise forms.ValidationError(gettext("A bearer token is one word (no spaces)."))
        return key

    def save(self, commit: bool = True) -> InferenceBackend:
        if self.cleaned_data.get("clear_api_key"):
            self.instance.api_key = ""
            self.cleaned_data["api_key"] = ""
        return super().save(commit=commit)


@admin.register(InferenceBackend)
class InferenceBackendAdmin(admin.ModelAdmin):
    form = InferenceBackendForm
    list_display = (
        "name",
        "model",
        "base_url",
        "weight",
        "is_enabled",
        "takes_complex_requests",
        "has_api_key",
        "health",
        "health_checked_at",
    )
    list_filter = ("is_enabled", "health", "model")
    search_fields = ("name", "model", "base_url")
    readonly_fields = ("health", "health_detail", "health_checked_at")
    actions = ("check_health_of_selected",)
    fieldsets = (
        (None, {"fields": ("name", "base_url", "api_key", "clear_api_key", "model")}),
        (_("Routing"), {"fields": ("weight", "is_enabled", "takes_complex_requests")}),
        (_("Health"), {"fields": ("health", "health_detail", "health_checked_at")}),
    )

    @admin.display(boolean=True, description=_("API key"))
    def has_api_key(self, backend: InferenceBackend) -> bool:
        return bool(backend.api_key)

    @admin.action(description=_("Check health of the selected backends"))
    def check_health_of_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        for backend in queryset:
            result = check_and_record(backend)
            level = messages.SUCCESS if result.is_up else messages.WARNING
            self.message_user(request, f"{backend.name}: {result.health} ({result.detail})", level)
