"""Collections of documents, the documents, and the chunks that search returns."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser, AnonymousUser, Group
from django.db import models
from django.db.models import Q, QuerySet
from django.utils.translation import gettext_lazy as _

from retrieval import reasons


class Collection(models.Model):
    """A knowledge base. Staff manage it; `readers` and `reader_groups` may search it."""

    name = models.CharField(_("name"), max_length=200, unique=True)
    description = models.TextField(_("description"), blank=True)
    readers = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="readable_collections",
        verbose_name=_("readers"),
    )
    reader_groups = models.ManyToManyField(
        Group, blank=True, related_name="readable_collections", verbose_name=_("reader groups")
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        ordering = ("name",)
        verbose_name = _("collection")
        verbose_name_plural = _("collections")

    def __str__(self) -> str:
        return self.name

    @classmethod
    def readable_by(cls, user: AbstractUser | AnonymousUser | None) -> QuerySet[Collection]:
        """The collections `user` may search; None means a trusted caller (CLI, eval)."""
        if user is None:
            return cls.objects.all()
        if not user.is_authenticated or not user.is_active:
            return cls.objects.none()
        if user.is_staff:
            return cls.objects.all()
        return cls.objects.filter(Q(readers=user) | Q(reader_groups__user=user)).distinct()


def upload_path(document: Document, filename: str) -> str:
    return f"documents/{document.collection_id}/{filename}"


class Document(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", _("Queued")
        PROCESSING = "processing", _("Processing")
        READY = "ready", _("Ready")
        FAILED = "failed", _("Failed")
        # NOTE: stopped by staff; holds no chunks or vectors, and start-up recovery leaves it.
        CANCELLED = "cancelled", _("Cancelled")

    collection = models.ForeignKey(
        Collection,
        on_delete=models.CASCADE,
        related_name="documents",
        verbose_name=_("collection"),
    )
    title = models.CharField(_("title"), max_length=300)
    file = models.FileField(_("file"), upload_to=upload_path, max_length=500)
    mime_type = models.CharField(_("MIME type"), max_length=120, blank=True)
    size_bytes = models.PositiveBigIntegerField(_("size in bytes"), default=0)
    content_hash = models.CharField(_("content hash"), max_length=64, blank=True, db_index=True)
    status = models.CharField(
        _("status"), max_length=12, choices=Status.choices, default=Status.QUEUED, db_index=True
    )
    progress = models.PositiveSmallIntegerField(_("progress"), default=0)
    # Why it failed: `error` in English (API clients read it), `error_reason` the same in no
    # language (`retrieval.reasons`), shown in each viewer's by `get_error_display`.
    error = models.TextField(_("error"), blank=True)
    error_reason = models.JSONField(_("error reason"), default=dict, blank=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        verbose_name=_("created by"),
    )
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ("-created_at",)
        verbose_name = _("document")
        verbose_name_plural = _("documents")

    def __str__(self) -> str:
        return self.title

    def get_error_display(self) -> str:
        """Why it failed, in the active language ("" unless it failed)."""
        return reasons.display(self.error, self.error_reason)


class Chunk(models.Model):
    """A passage of a document; its primary key is also its vector id in the faiss index."""

    document = models.ForeignKey(
        Document, on_delete=models.CASCADE, related_name="chunks", verbose_name=_("document")
    )
    ordinal = models.PositiveIntegerField(_("ordinal"))
    text = models.TextField(_("text"))
    token_count = models.PositiveIntegerField(_("token count"))
    char_start = models.PositiveIntegerField(_("char start"))
    char_end = models.PositiveIntegerField(_("char end"))
    page = models.PositiveIntegerField(_("page"), null=True, blank=True)
    heading_path = models.JSONField(_("heading path"), default=list, blank=True)

    class Meta:
        ordering = ("document_id", "ordinal")
        verbose_name = _("chunk")
        verbose_name_plural = _("chunks")
        constraints = [
            models.UniqueConstraint(fields=("document", "ordinal"), name="chunk_ordinal_unique")
        ]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.ordinal}"


# NOTE: the tables of BM25 in the database live in their own module; imported here so that
# Django registers them with the app.
from retrieval.inverted_index import (  # noqa: E402, F401
    CorpusShard,
    IndexedChunk,
    Posting,
    TermStats,
)
