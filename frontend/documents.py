"""A document a reader may read, at a cited passage: the page (phones, links) and its JSON (the
chat's source panel). Both show the text the chunks hold with the cited chunk's span marked.

Security: a document is found only among the collections its reader may read
(`Collection.readable_by`); any other is "no such document", for the page and the JSON alike.
The text is escaped by the template, and the panel sets it with textContent only.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode

from retrieval.cited_text import Block, cited_text
from retrieval.models import Collection, Document


def readable_document(request: HttpRequest, document_id: int) -> Document:
    """The document if `request.user` may read its collection; Http404 if not (or none)."""
    found = (
        Document.objects.select_related("collection")
        .filter(pk=document_id, collection__in=Collection.readable_by(request.user))
        .first()
    )
    if found is None:
        raise Http404("no such document")
    return found


def _int_param(request: HttpRequest, name: str) -> int | None:
    value = request.GET.get(name, "")
    return int(value) if value.isascii() and value.isdigit() else None


def passage_url(document_id: int, chunk_id: int, conversation_id: int | None = None) -> str:
    """The document page at chunk `chunk_id`, marked (`conversation_id`: where Back goes)."""
    query = {"chunk": chunk_id}
    if conversation_id is not None:
        query["conversation"] = conversation_id
    url = reverse("frontend:document", args=[document_id])
    return f"{url}?{urlencode(query)}#chunk-{chunk_id}"


@login_required
def document(request: HttpRequest, document_id: int) -> HttpResponse:
    """The page: `?chunk=<id>` marks that chunk; `?conversation=<id>`: Back returns there."""
    found = readable_document(request, document_id)
    text = cited_text(found, _int_param(request, "chunk"))
    conversation_id = _int_param(request, "conversation")
    context = {
        "document": found,
        "text": text,
        "asked_chunk": _int_param(request, "chunk"),
        "back_url": f"/c/{conversation_id}/" if conversation_id is not None else "/",
    }
    return render(request, "frontend/document.html", context)


def document_text(request: HttpRequest, document_id: int) -> JsonResponse:
    """The JSON the source panel shows; `?chunk=<id>` marks that chunk. 404 for anyone who may
    not read the document, signed in or not (the panel's fetch should not follow a redirect)."""
    found = readable_document(request, document_id)
    chunk_id = _int_param(request, "chunk")
    text = cited_text(found, chunk_id)
    cited = text.cited
    return JsonResponse(
        {
            "id": found.pk,
            "title": found.title,
            "collection": found.collection.name,
            "status": found.status,
            "status_label": str(found.get_status_display()),
            "num_chunks": text.num_chunks,
            "page_url": (
                passage_url(found.pk, chunk_id)
                if chunk_id is not None
                else reverse("frontend:document", args=[found.pk])
            ),
            "cited": None
            if cited is None
            else {"chunk_id": cited.pk, "page": cited.page, "heading_path": cited.heading_path},
            "blocks": [_block_json(block) for block in text.blocks],
        }
    )


def _block_json(block: Block) -> dict:
    return {
        "page": block.page,
        "heading_path": block.heading_path,
        "runs": [
            {
                "cited": run.is_cited,
                "pieces": [{"text": p.text, "anchor": p.anchor_chunk_id} for p in run.pieces],
            }
            for run in block.runs
        ],
    }
