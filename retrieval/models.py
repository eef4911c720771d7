"""Collections of documents, the documents, and the chunks that search returns."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser, AnonymousUser, Group
from django.db import models
from django.db.models import Q, QuerySet


class Collection(models.Model):
    """A knowledge base. Staff manage it; `readers` and `reader_groups` may search it."""

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True)
    readers = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="readable_collections"
    )
    reader_groups = models.ManyToManyField(Group, blank=True, related_name="readable_collections")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("name",)

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
        QUEUED = "queued"
        PROCESSING = "processing"
        READY = "ready"
        FAILED = "failed"

    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="documents")
    title = models.CharField(max_length=300)
    file = models.FileField(upload_to=upload_path, max_length=500)
    mime_type = models.CharField(max_length=120, blank=True)
    size_bytes = models.PositiveBigIntegerField(default=0)
    content_hash = models.CharField(max_length=64, blank=True, db_index=True)
    status = models.CharField(
        max_length=12, choices=Status.choices, default=Status.QUEUED, db_index=True
    )
    progress = models.PositiveSmallIntegerField(default=0)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return self.title


class Chunk(models.Model):
    """A passage of a document; its primary key is also its vector id in the faiss index."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    ordinal = models.PositiveIntegerField()
    text = models.TextField()
    token_count = models.PositiveIntegerField()
    char_start = models.PositiveIntegerField()
    char_end = models.PositiveIntegerField()
    page = models.PositiveIntegerField(null=True, blank=True)
    heading_path = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ("document_id", "ordinal")
        constraints = [
            models.UniqueConstraint(fields=("document", "ordinal"), name="chunk_ordinal_unique")
        ]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.ordinal}"
