"""The ingestion queue of the chat UI (staff): every document's state, cancel, retry, bulk upload.

Progress is the document row's (`retrieval.progress`); the page follows running documents on
their progress sockets and polls this list while anything is queued or running.
"""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods

from api.documents import document_json
from chat.staff import staff_required_json
from chat.views import error_response
from retrieval.bulk import add_files
from retrieval.cancellation import RETRYABLE, cancel
from retrieval.models import Collection, Document
from retrieval.tasks import drop_unqueued, enqueue_ingest, was_not_queued

# The newest documents listed; older ones are in the admin.
MAX_LISTED = 300


@require_http_methods(["GET"])
@staff_required_json
def queue(request: HttpRequest) -> JsonResponse:
    documents = Document.objects.select_related("collection").order_by("-created_at", "-pk")
    return JsonResponse({"documents": [document_json(d) for d in documents[:MAX_LISTED]]})


def _not_found(document_id: int) -> JsonResponse:
    return error_response(404, "not_found", _("document %(id)s not found") % {"id": document_id})


@require_http_methods(["POST"])
@staff_required_json
def cancel_ingestion(request: HttpRequest, document_id: int) -> JsonResponse:
    document = cancel(document_id)
    if document is None:
        return _not_found(document_id)
    if document.status != Document.Status.CANCELLED:
        message = _("%(title)s is no longer queued or running (%(status)s).") % {
            "title": document.title,
            "status": document.get_status_display(),
        }
        return error_response(409, "not_cancellable", message)
    return JsonResponse({"document": document_json(document)})


@require_http_methods(["POST"])
@staff_required_json
def retry_ingestion(request: HttpRequest, document_id: int) -> JsonResponse:
    """Queue a failed or cancelled document again, from its stored file."""
    document = Document.objects.select_related("collection").filter(pk=document_id).first()
    if document is None:
        return _not_found(document_id)
    if document.status not in RETRYABLE:
        message = _("Only a failed or cancelled document can be retried; %(title)s is %(status)s.")
        values = {"title": document.title, "status": document.get_status_display()}
        return error_response(409, "not_retryable", message % values)
    if not document.file or not document.file.storage.exists(document.file.name):
        message = _("The stored file of %(title)s is gone; upload it again.")
        return error_response(409, "file_missing", message % {"title": document.title})
    with transaction.atomic():
        enqueue_ingest(document)
    if was_not_queued(document):
        return error_response(503, "queue_unavailable", document.get_error_display())
    document.refresh_from_db()
    return JsonResponse({"document": document_json(document)}, status=202)


@require_http_methods(["POST"])
@staff_required_json
def bulk_upload(request: HttpRequest) -> JsonResponse:
    """Multipart `collection`, `file` (many: a folder's files, zips) and `path` (each file's
    relative path, in order; optional) -> `{results: [{name, document?, skipped?}]}`."""
    collection = Collection.objects.filter(pk=_int(request.POST.get("collection"))).first()
    if collection is None:
        return error_response(400, "invalid", _("Choose a collection."))
    uploads = request.FILES.getlist("file")
    if not uploads:
        return error_response(400, "invalid", _("Choose files or a zip to upload."))
    paths = request.POST.getlist("path")
    names = [
        (paths[i] if i < len(paths) and paths[i] else upload.name) or ""
        for i, upload in enumerate(uploads)
    ]
    with transaction.atomic():
        results = add_files(collection, uploads, names, request.user)
    documents = [result.document for result in results if result.document is not None]
    reason = drop_unqueued(documents)
    if reason is not None:
        return error_response(503, "queue_unavailable", reason)
    for document in documents:
        document.refresh_from_db(fields=["status", "progress", "error"])
    body = {
        "results": [
            {
                "name": result.name,
                "document": document_json(result.document) if result.document else None,
                "skipped": result.skipped,
            }
            for result in results
        ]
    }
    return JsonResponse(body, status=201 if documents else 200)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
