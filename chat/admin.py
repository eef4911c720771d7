"""Admin for assistant profiles and answer feedback. Conversations stay private to their owners:
not listed here; a rated answer is shown with its question, because the user chose to rate it."""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from chat.models import AnswerFeedback, AssistantProfile, question_of
from evals.golden import add_to_golden_set

EXCERPT_CHARS = 80


@admin.register(AssistantProfile)
class AssistantProfileAdmin(admin.ModelAdmin):
    list_display = ("name", "is_default", "routing", "temperature", "max_tokens", "updated_at")
    filter_horizontal = ("collections",)
    fieldsets = (
        (None, {"fields": ("name", "is_default", "system_prompt")}),
        (_("Retrieval"), {"fields": ("collections", "search_top_k")}),
        (_("Backend"), {"fields": ("routing",)}),
        (
            _("Sampling (empty: the active model configuration's defaults)"),
            {"fields": ("temperature", "top_p", "top_k", "max_tokens")},
        ),
    )


@admin.register(AnswerFeedback)
class AnswerFeedbackAdmin(admin.ModelAdmin):
    list_display = ("rating", "question_excerpt", "answer_excerpt", "note", "answered_by", "user")
    list_display_links = ("rating", "question_excerpt")
    list_filter = ("rating", "message__model", "updated_at")
    search_fields = ("note", "message__content")
    list_select_related = ("message", "user")
    fields = (
        "rating",
        "note",
        "user",
        "question",
        "answer",
        "answered_by",
        "sources",
        "updated_at",
    )
    readonly_fields = ("user", "question", "answer", "answered_by", "sources", "updated_at")

    actions = ("add_to_golden_set",)

    # NOTE: the action adds golden questions (it changes no feedback): it needs that right.
    @admin.action(description=_("Add to golden set"), permissions=["add_golden"])
    def add_to_golden_set(self, request: HttpRequest, queryset: QuerySet[AnswerFeedback]) -> None:
        added = add_to_golden_set(queryset.select_related("message"), request.user)
        count = len(added.created)
        self.message_user(
            request,
            ngettext(
                "%(count)d question added to the golden set.",
                "%(count)d questions added to the golden set.",
                count,
            )
            % {"count": count},
            messages.SUCCESS if count else messages.WARNING,
        )
        if added.num_needing_answer:
            self.message_user(
                request,
                ngettext(
                    "%(count)d was rated down: write its expected answer in the golden set.",
                    "%(count)d were rated down: write their expected answers in the golden set.",
                    added.num_needing_answer,
                )
                % {"count": added.num_needing_answer},
                messages.WARNING,
            )
        if added.num_already:
            self.message_user(
                request,
                ngettext(
                    "%(count)d was already in the golden set.",
                    "%(count)d were already in the golden set.",
                    added.num_already,
                )
                % {"count": added.num_already},
                messages.INFO,
            )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # feedback comes from the chat, by the answer's owner

    def has_add_golden_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("evals.add_goldenquestion")

    def get_queryset(self, request: HttpRequest) -> QuerySet[AnswerFeedback]:
        return super().get_queryset(request).select_related("message", "user")

    @admin.display(description=_("question"))
    def question(self, feedback: AnswerFeedback) -> str:
        asked = question_of(feedback.message)
        return asked.content if asked is not None else ""

    @admin.display(description=_("question"))
    def question_excerpt(self, feedback: AnswerFeedback) -> str:
        return Truncator(self.question(feedback)).chars(EXCERPT_CHARS)

    @admin.display(description=_("answer"))
    def answer(self, feedback: AnswerFeedback) -> str:
        return feedback.message.content

    @admin.display(description=_("answer"))
    def answer_excerpt(self, feedback: AnswerFeedback) -> str:
        return Truncator(feedback.message.content).chars(EXCERPT_CHARS)

    @admin.display(description=_("model"), ordering="message__model")
    def answered_by(self, feedback: AnswerFeedback) -> str:
        return feedback.message.model

    @admin.display(description=_("retrieved sources"))
    def sources(self, feedback: AnswerFeedback) -> SafeString:
        return format_html_join(
            "",
            '<div><a href="{}">[{}] {}</a></div>',
            (
                (s.get("url", ""), s.get("n", ""), s.get("document_title", ""))
                for s in feedback.message.sources
            ),
        )
