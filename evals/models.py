"""The golden set and the evaluation runs over it.

A golden question is a question with what a good answer says and where it is found; staff make
them from rated answers (evals.golden) and edit them in the admin. An evaluation run scores the
served search and the served model on every active golden question (evals.evaluation) and keeps
its figures and a row per question, so the staff page shows them over time.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from chat.models import AnswerFeedback
from retrieval.models import Chunk, Collection, Document


class GoldenQuestion(models.Model):
    question = models.TextField(_("question"))
    expected_answer = models.TextField(
        _("expected answer"),
        blank=True,
        help_text=_(
            "What a good answer says. Empty: the question scores retrieval only (write it for "
            "an answer that was rated down)."
        ),
    )
    expected_chunks = models.ManyToManyField(
        Chunk,
        blank=True,
        related_name="+",
        verbose_name=_("expected chunks"),
        help_text=_("The passages a search should find; scored by chunk while any exists."),
    )
    expected_documents = models.ManyToManyField(
        Document,
        blank=True,
        related_name="+",
        verbose_name=_("expected documents"),
        help_text=_(
            "The documents holding the answer; scored by document when no expected chunk is "
            "left (a document ingested again gets new chunks)."
        ),
    )
    collections = models.ManyToManyField(
        Collection,
        blank=True,
        related_name="+",
        verbose_name=_("collections"),
        help_text=_("Searched for this question; none: every collection."),
    )
    feedback = models.ForeignKey(
        AnswerFeedback,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="golden_questions",
        verbose_name=_("from feedback"),
    )
    is_active = models.BooleanField(_("active"), default=True, help_text=_("Evaluated in runs."))
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("created by"),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = _("golden question")
        verbose_name_plural = _("golden set")

    def __str__(self) -> str:
        return self.question[:80]


class EvalRun(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", _("Queued")
        RUNNING = "running", _("Running")
        DONE = "done", _("Done")
        FAILED = "failed", _("Failed")

    status = models.CharField(
        _("status"), max_length=8, choices=Status.choices, default=Status.QUEUED
    )
    error = models.TextField(_("error"), blank=True)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("started by"),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    model = models.CharField(_("model"), max_length=300, blank=True)
    embedding_model = models.CharField(_("embedding model"), max_length=300, blank=True)
    num_questions = models.PositiveIntegerField(_("questions"), default=0)
    # Means over the questions each applies to (retrieval: with expected chunks or documents;
    # answers: with an expected answer); None where no question had what it needs.
    recall1 = models.FloatField(_("recall@1"), null=True, blank=True)
    recall5 = models.FloatField(_("recall@5"), null=True, blank=True)
    ndcg10 = models.FloatField(_("nDCG@10"), null=True, blank=True)
    mrr10 = models.FloatField(_("MRR@10"), null=True, blank=True)
    answer_f1 = models.FloatField(_("answer F1"), null=True, blank=True)
    answer_contained = models.FloatField(_("answer contained"), null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = _("evaluation run")
        verbose_name_plural = _("evaluation runs")

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in (self.Status.QUEUED, self.Status.RUNNING)


class EvalResult(models.Model):
    """One golden question's outcome in one run (kept when the question is edited or deleted)."""

    run = models.ForeignKey(EvalRun, on_delete=models.CASCADE, related_name="results")
    golden = models.ForeignKey(
        GoldenQuestion, null=True, on_delete=models.SET_NULL, related_name="results"
    )
    question = models.TextField()
    expected_answer = models.TextField(blank=True)
    answer = models.TextField(blank=True)
    # "chunk" or "document": what the retrieval scores count as found; "" without expectations.
    retrieval_level = models.CharField(max_length=8, blank=True)
    expected = models.JSONField(default=list)  # the relevant ids at that level
    retrieved = models.JSONField(default=list)  # [{rank, chunk_id, document_id, title, hit}]
    recall1 = models.FloatField(null=True)
    recall5 = models.FloatField(null=True)
    ndcg10 = models.FloatField(null=True)
    mrr10 = models.FloatField(null=True)
    answer_f1 = models.FloatField(null=True)
    answer_contained = models.FloatField(null=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
