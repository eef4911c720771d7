"""Admin: collections, multi-file upload, live ingestion progress, re-ingest, search preview."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from retrieval.forms import SearchPreviewForm, UploadForm
from retrieval.models import Chunk, Collection, Document
from retrieval.tasks import add_upload, enqueue_ingest, was_not_queued

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class _DocumentCount(TypedDict):
    document_count: int


@admin.register(Collection)
class CollectionAdmin(admin.ModelAdmin[Collection]):
    list_display = ("name", "description", "num_documents", "created_at")
    search_fields = ("name", "description")
    filter_horizontal = ("readers", "reader_groups")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Collection]:
        return super().get_queryset(request).annotate(document_count=Count("documents"))

    @admin.display(description=gettext_lazy("documents"), ordering="document_count")
    def num_documents(self, collection: WithAnnotations[Collection, _DocumentCount]) -> int:
        return collection.document_count


class ChunkInline(admin.TabularInline[Chunk, Document]):
    model = Chunk
    fields = ("ordinal", "page", "heading_path", "token_count", "char_start", "char_end", "text")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Document | None = None) -> bool:
        return False


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin[Document]):
    change_list_template = "admin/retrieval/document/change_list.html"
    list_display = (
        "title", "collection", "status", "progress_bar", "size_display", "mime_type", "updated_at"
    )  # fmt: skip
    list_filter = ("status", "collection")
    search_fields = ("title",)
    # NOTE: the failure reason is shown in the viewer's language (`error_display`), not as stored.
    exclude = ("error",)
    readonly_fields = (
        "mime_type", "size_bytes", "content_hash", "status", "progress", "error_display",
        "created_by", "created_at", "updated_at",
    )  # fmt: skip
    actions = ("reingest_selected",)
    inlines = (ChunkInline,)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("upload/", view(self.upload_view), name="retrieval_document_upload"),
            path("search/", view(self.search_view), name="retrieval_document_search"),
            path("progress/", view(self.progress_view), name="retrieval_document_progress"),
            *super().get_urls(),
        ]

    @admin.display(description=gettext_lazy("progress"), ordering="progress")
    def progress_bar(self, document: Document) -> str:
        return format_html(
            '<progress class="cachet-progress" data-document-id="{}" data-status="{}" max="100"'
            ' value="{}"></progress> <span data-progress-label="{}">{}</span>',
            document.pk, document.status, document.progress, document.pk,
            f"{_('failed')}: {document.get_error_display()}"
            if document.status == Document.Status.FAILED else f"{document.progress}%",
        )  # fmt: skip

    @admin.display(description=gettext_lazy("error"))
    def error_display(self, document: Document) -> str:
        return document.get_error_display()

    @admin.display(description=gettext_lazy("size"), ordering="size_bytes")
    def size_display(self, document: Document) -> str:
        return f"{document.size_bytes / 1024:.1f} KB"

    def save_model(self, request: HttpRequest, obj: Document, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = _admin_user(request)
            obj.title = obj.title or Path(obj.file.name or "").name
        super().save_model(request, obj, form, change)
        if not change or "file" in form.changed_data:
            enqueue_ingest(obj)

    @admin.action(description=gettext_lazy("Re-ingest selected documents"))
    def reingest_selected(self, request: HttpRequest, queryset: QuerySet[Document]) -> None:
        documents = list(queryset)
        with transaction.atomic():
            for document in documents:
                enqueue_ingest(document)
        count = len(documents)
        self.message_user(
            request,
            ngettext(
                "%(count)d document queued for ingestion.",
                "%(count)d documents queued for ingestion.",
                count,
            )
            % {"count": count},
        )
        _report_unqueued(request, documents)

    def upload_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_add_permission(request):
            return HttpResponse(status=403)
        form = UploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            collection = form.cleaned_data["collection"]
            with transaction.atomic():
                documents = [
                    add_upload(collection, upload, _admin_user(request))
                    for upload in form.cleaned_data["files"]
                ]
            count = len(form.cleaned_data["files"])
            message = ngettext(
                "%(count)d file uploaded to %(collection)s; ingesting.",
                "%(count)d files uploaded to %(collection)s; ingesting.",
                count,
            )
            messages.success(request, message % {"count": count, "collection": collection})
            _report_unqueued(request, documents)
            return redirect(reverse("admin:retrieval_document_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": _("Upload documents"),
            "form": form,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/retrieval/document/upload.html", context)

    def search_view(self, request: HttpRequest) -> HttpResponse:
        """The top-K of a query; the retrieval test page (frontend) shows its whole pool."""
        form = SearchPreviewForm(request.GET or None)
        explanation = None
        if request.GET and form.is_valid():
            explanation = form.explain(request.user)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Search preview"),
            "form": form,
            "explanation": explanation,
            "hits": None if explanation is None else [entry.hit for entry in explanation.kept],
            "full_pool_url": f"{reverse('frontend:retrieval-test')}?{request.GET.urlencode()}",
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/retrieval/document/search.html", context)

    def progress_view(self, request: HttpRequest) -> JsonResponse:
        """Status and progress of the documents in `?ids=1,2,3`.

        The change list follows progress over `ws/documents/<id>/progress/` (consumers.py) and
        polls this view only where the WebSocket cannot be opened.
        """
        try:
            ids = [int(i) for i in request.GET.get("ids", "").split(",") if i.strip()][:500]
        except ValueError:
            return JsonResponse({"error": "ids must be comma-separated integers"}, status=400)
        documents = Document.objects.filter(pk__in=ids).only(
            "id", "status", "progress", "error", "error_reason"
        )
        rows = [
            {
                "id": document.pk,
                "status": document.status,
                "progress": document.progress,
                "error": document.get_error_display(),
            }
            for document in documents
        ]
        return JsonResponse({"documents": rows})


def _admin_user(request: HttpRequest) -> User:
    """The signed-in staff user; `admin_view` lets no one else reach the views above."""
    if not isinstance(request.user, User) or not request.user.is_staff:
        raise PermissionDenied
    return request.user


def _report_unqueued(request: HttpRequest, documents: list[Document]) -> None:
    """Say so when the broker refused ingestion tasks (the documents show it as their error)."""
    unqueued = [document for document in documents if was_not_queued(document)]
    if unqueued:
        message = ngettext(
            "%(count)d document could not be queued: the task broker is unreachable. "
            "Re-ingest it once it is back.",
            "%(count)d documents could not be queued: the task broker is unreachable. "
            "Re-ingest them once it is back.",
            len(unqueued),
        )
        messages.error(request, message % {"count": len(unqueued)})
