"""Collections over the API: staff keys create, rename, share and delete them; every key lists
the collections its user may read (the UI's and the admin's rules, `Collection.readable_by`)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.models import Count
from django.http import HttpRequest, JsonResponse
from ninja import Router

from api.errors import ApiError, require_staff
from api.schemas import CollectionCreate, CollectionUpdate
from retrieval.models import Collection

router = Router(tags=["Collections"])


def collection_json(collection: Collection, *, with_readers: bool) -> dict:
    """The collection; its readers only for staff (who grant them)."""
    body = {
        "id": collection.pk,
        "object": "collection",
        "name": collection.name,
        "description": collection.description,
        "num_documents": collection.num_documents,
        "created_at": collection.created_at.isoformat(),
    }
    if with_readers:
        # NOTE: .all(), so a listing's prefetched readers serve every collection in 3 queries
        body["readers"] = sorted(user.username for user in collection.readers.all())
        body["reader_groups"] = sorted(group.name for group in collection.reader_groups.all())
    return body


def _readable(user):
    return Collection.readable_by(user).annotate(num_documents=Count("documents", distinct=True))


def _readable_collection(user, collection_id: int) -> Collection:
    collection = _readable(user).filter(pk=collection_id).first()
    if collection is None:
        raise ApiError(404, f"Collection {collection_id} does not exist.", code="not_found")
    return collection


def _named(model, field: str, names: list[str], what: str, param: str) -> list:
    """The `model` rows whose `field` is one of `names`: a 400 naming any that do not exist."""
    rows = list(model.objects.filter(**{f"{field}__in": names}))
    missing = sorted(set(names) - {getattr(row, field) for row in rows})
    if missing:
        raise ApiError(400, f"No {what} named {', '.join(map(repr, missing))}.", param=param)
    return rows


def _save(collection: Collection, readers: list[str] | None, groups: list[str] | None) -> None:
    """Save the collection and replace the reader sets given, all or nothing."""
    # NOTE: names are checked before anything is written, so a refused request changes nothing.
    reader_users = (
        None
        if readers is None
        else _named(get_user_model(), "username", readers, "user", "readers")
    )
    reader_groups = (
        None if groups is None else _named(Group, "name", groups, "group", "reader_groups")
    )
    try:
        with transaction.atomic():
            collection.save()
            if reader_users is not None:
                collection.readers.set(reader_users)
            if reader_groups is not None:
                collection.reader_groups.set(reader_groups)
    except IntegrityError:
        raise ApiError(
            409, f"A collection named {collection.name!r} exists already.", param="name"
        ) from None


@router.get("/collections", summary="List the collections the key may read")
def list_collections(request: HttpRequest) -> dict:
    user = request.auth.user
    collections = _readable(user).prefetch_related("readers", "reader_groups")
    return {
        "object": "list",
        "data": [collection_json(c, with_readers=user.is_staff) for c in collections],
    }


@router.post("/collections", summary="Create a collection (staff)", response={201: dict})
def create_collection(request: HttpRequest, body: CollectionCreate) -> tuple[int, dict]:
    require_staff(request.auth.user, "collections")
    collection = Collection(name=body.name, description=body.description)
    _save(collection, body.readers, body.reader_groups)
    collection.num_documents = 0
    return 201, collection_json(collection, with_readers=True)


@router.get("/collections/{collection_id}", summary="A collection the key may read")
def get_collection(request: HttpRequest, collection_id: int) -> dict:
    user = request.auth.user
    return collection_json(_readable_collection(user, collection_id), with_readers=user.is_staff)


@router.patch(
    "/collections/{collection_id}", summary="Rename, describe or share a collection (staff)"
)
def update_collection(request: HttpRequest, collection_id: int, body: CollectionUpdate) -> dict:
    user = request.auth.user
    collection = _readable_collection(user, collection_id)
    require_staff(user, "collections")
    if body.name is not None:
        collection.name = body.name
    if body.description is not None:
        collection.description = body.description
    _save(collection, body.readers, body.reader_groups)
    return collection_json(collection, with_readers=True)


@router.delete("/collections/{collection_id}", summary="Delete a collection and its documents")
def delete_collection(request: HttpRequest, collection_id: int) -> JsonResponse:
    user = request.auth.user
    collection = _readable_collection(user, collection_id)
    require_staff(user, "collections")
    num_documents = collection.documents.count()
    # NOTE: each document's own delete signal removes its file and vectors after the commit.
    with transaction.atomic():
        collection.delete()
    return JsonResponse(
        {
            "id": collection_id,
            "object": "collection",
            "deleted": True,
            "num_documents_deleted": num_documents,
        }
    )
