"""Admin for the golden set (editable) and evaluation runs (read only; the staff page runs them)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.models import User
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from evals.models import EvalRun, GoldenQuestion


@admin.register(GoldenQuestion)
class GoldenQuestionAdmin(admin.ModelAdmin[GoldenQuestion]):
    list_display = (
        "short_question",
        "has_expected_answer",
        "num_expected_chunks",
        "is_active",
        "updated_at",
    )
    list_filter = ("is_active",)
    search_fields = ("question", "expected_answer")
    fields = (
        "question",
        "expected_answer",
        "expected_chunks",
        "expected_documents",
        "collections",
        "is_active",
        "feedback",
        "created_by",
    )
    raw_id_fields = ("expected_chunks", "expected_documents", "feedback")
    filter_horizontal = ("collections",)
    readonly_fields = ("created_by",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[GoldenQuestion]:
        queryset: QuerySet[GoldenQuestion] = super().get_queryset(request)
        return queryset.annotate(num_chunks=Count("expected_chunks"))

    def save_model(
        self, request: HttpRequest, obj: GoldenQuestion, form: Any, change: bool
    ) -> None:
        if obj.created_by is None and isinstance(request.user, User):
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

    @admin.display(description=_("question"), ordering="question")
    def short_question(self, golden: GoldenQuestion) -> str:
        return Truncator(golden.question).chars(100)

    @admin.display(description=_("expected answer"), boolean=True)
    def has_expected_answer(self, golden: GoldenQuestion) -> bool:
        return bool(golden.expected_answer.strip())

    @admin.display(description=_("expected chunks"), ordering="num_chunks")
    def num_expected_chunks(self, golden: GoldenQuestion) -> int:
        return int(golden.num_chunks)  # type: ignore[attr-defined]


@admin.register(EvalRun)
class EvalRunAdmin(admin.ModelAdmin[EvalRun]):
    list_display = (
        "created_at",
        "status",
        "model",
        "num_questions",
        "recall5",
        "ndcg10",
        "answer_f1",
        "page_link",
    )
    list_filter = ("status", "model")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs start from the evaluation page

    def has_change_permission(self, request: HttpRequest, obj: EvalRun | None = None) -> bool:
        return False

    @admin.display(description=_("details"))
    def page_link(self, run: EvalRun) -> SafeString:
        url = reverse("frontend:evaluation") + f"#run-{run.pk}"
        return format_html('<a href="{}">{}</a>', url, _("Open on the evaluation page"))
