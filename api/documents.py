"""Documents and search over the API, with the UI's permissions: staff manage documents,
readers of a collection see its documents and search it."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.utils.datastructures import MultiValueDict
from ninja import File, Form, Router
from ninja.files import UploadedFile

from api.errors import ApiError, require_staff
from api.schemas import SearchRequest
from chat.prompt import source_json
from retrieval.forms import UploadForm
from retrieval.models import Collection, Document
from retrieval.search import search
from retrieval.tasks import add_upload, drop_unqueued

router = Router(tags=["Documents"])
MAX_LISTED = 1000


def document_json(document: Document) -> dict:
    return {
        "id": document.pk,
        "object": "document",
        "title": document.title,
        "collection": {"id": document.collection_id, "name": document.collection.name},
        "status": document.status,
        "progress": document.progress,
        # NOTE: in the request's language: English (as stored) unless it asks for another.
        "error": document.get_error_display(),
        "size_bytes": document.size_bytes,
        "created_at": document.created_at.isoformat(),
    }


def _visible_document(user, document_id: int) -> Document:
    document = (
        Document.objects.select_related("collection")
        .filter(pk=document_id, collection__in=Collection.readable_by(user))
        .first()
    )
    if document is None:
        raise ApiError(404, f"Document {document_id} does not exist.", code="not_found")
    return document


@router.post("/documents", summary="Upload a document (staff)", response={201: dict})
def upload_document(
    request: HttpRequest, file: File[UploadedFile], collection: Form[int]
) -> tuple[int, dict]:
    user = request.auth.user
    require_staff(user, "documents")
    limit_mb = settings.CACHET_MAX_UPLOAD_MB
    if file.size > limit_mb * 1024 * 1024:
        raise ApiError(413, f"{file.name} is larger than the {limit_mb} MB limit.", param="file")
    form = UploadForm({"collection": collection}, MultiValueDict({"files": [file]}))
    if not form.is_valid():
        errors = form.errors.get_json_data()
        message = " ".join(e["message"] for field in errors.values() for e in field)
        raise ApiError(400, message)
    with transaction.atomic():
        document = add_upload(form.cleaned_data["collection"], file, user)
    reason = drop_unqueued([document])
    if reason is not None:
        raise ApiError(503, reason, code="queue_unavailable", headers={"Retry-After": "10"})
    document.refresh_from_db()
    return 201, document_json(document)


@router.get("/documents", summary="List the documents the key may read")
def list_documents(request: HttpRequest, collection: int | None = None) -> dict:
    documents = Document.objects.select_related("collection").filter(
        collection__in=Collection.readable_by(request.auth.user)
    )
    if collection is not None:
        documents = documents.filter(collection_id=collection)
    return {"object": "list", "data": [document_json(d) for d in documents[:MAX_LISTED]]}


@router.get("/documents/{document_id}", summary="A document and its ingestion status")
def get_document(request: HttpRequest, document_id: int) -> dict:
    return document_json(_visible_document(request.auth.user, document_id))


@router.delete("/documents/{document_id}", summary="Delete a document (staff)")
def delete_document(request: HttpRequest, document_id: int) -> JsonResponse:
    user = request.auth.user
    document = _visible_document(user, document_id)
    require_staff(user, "documents")
    document.delete()
    return JsonResponse({"id": document_id, "object": "document", "deleted": True})


@sync_to_async
def readable_collection_ids(user, wanted: list[int | str] | None) -> list[int]:
    """Ids of `wanted` collections (ids or names; None: all readable), each readable by `user`."""
    readable = Collection.readable_by(user)
    if wanted is None:
        return sorted(readable.values_list("pk", flat=True))
    ids = []
    for item in wanted:
        lookup = {"pk": item} if isinstance(item, int) else {"name": item}
        collection = Collection.objects.filter(**lookup).first()
        if collection is None:
            raise ApiError(404, f"Collection {item!r} does not exist.", param="collections")
        if not readable.filter(pk=collection.pk).exists():
            raise ApiError(403, f"This key may not read collection {item!r}.", param="collections")
        ids.append(collection.pk)
    return ids


@router.post("/search", summary="Search documents: chunks with scores and citations")
async def search_documents(request: HttpRequest, body: SearchRequest) -> dict:
    user = request.auth.user
    collection_ids = await readable_collection_ids(user, body.collections)
    hits = await sync_to_async(search, thread_sensitive=False)(
        body.query, collection_ids, body.top_k, user=user
    )
    return {
        "object": "list",
        "data": [source_json(n, hit) for n, hit in enumerate(hits, start=1)],
    }
