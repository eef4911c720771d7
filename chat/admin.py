"""Admin for assistant profiles. Conversations stay private to their owners: not listed here."""

from django.contrib import admin

from chat.models import AssistantProfile


@admin.register(AssistantProfile)
class AssistantProfileAdmin(admin.ModelAdmin):
    list_display = ("name", "is_default", "routing", "temperature", "max_tokens", "updated_at")
    filter_horizontal = ("collections",)
    fieldsets = (
        (None, {"fields": ("name", "is_default", "system_prompt")}),
        ("Retrieval", {"fields": ("collections", "search_top_k")}),
        ("Backend", {"fields": ("routing",)}),
        (
            "Sampling (empty: the active model configuration's defaults)",
            {"fields": ("temperature", "top_p", "top_k", "max_tokens")},
        ),
    )
