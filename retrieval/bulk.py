"""Bulk upload: many files (a folder) and zips, each file a document or skipped with a reason.

One bad file never fails the others: each gets its own result, in the order given, so the
uploader sees which files became documents and why the rest did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import UploadedFile
from django.utils.translation import gettext as _

from retrieval.archive import (
    MAX_MEMBERS,
    ArchiveError,
    Member,
    is_zip,
    too_large_reason,
    unpack,
    unsupported_reason,
)
from retrieval.models import Collection, Document
from retrieval.tasks import enqueue_ingest


@dataclass(slots=True)
class FileResult:
    """One file of a bulk upload: the document made of it, or why it was skipped."""

    name: str
    document: Document | None = None
    skipped: str = ""


def add_files(
    collection: Collection,
    uploads: Sequence[UploadedFile[bytes]],
    names: Sequence[str],
    user: User | None,
) -> list[FileResult]:
    """Queue every supported file of `uploads` (zips unpacked) as a document of `collection`.

    `names`: each upload's name as the uploader sees it (a folder's relative path); Django keeps
    only the base name of an uploaded file. Call inside a transaction: ingestion is queued when
    it commits.
    """
    results: list[FileResult] = []
    for upload, name in zip(uploads, names, strict=True):
        if len(results) >= MAX_MEMBERS:
            results.append(FileResult(name, skipped=_too_many()))
            continue
        if too_large := too_large_reason(upload.size or 0):
            results.append(FileResult(name, skipped=too_large))
        elif is_zip(name):
            results.extend(_add_zip(collection, upload, name, user, MAX_MEMBERS - len(results)))
        elif reason := unsupported_reason(name):
            results.append(FileResult(name, skipped=reason))
        else:
            results.append(FileResult(name, _add(collection, name, upload, user)))
    return results


def _add_zip(
    collection: Collection,
    upload: UploadedFile[bytes],
    name: str,
    user: User | None,
    room: int,
) -> list[FileResult]:
    try:
        verdicts = list(unpack(upload.read()))
    except ArchiveError as error:
        return [FileResult(name, skipped=str(error))]
    results: list[FileResult] = []
    for verdict in verdicts:
        member_name = f"{name}/{verdict.name}"
        if len(results) >= room:
            results.append(FileResult(member_name, skipped=_too_many()))
        elif isinstance(verdict, Member):
            file = ContentFile(verdict.data, name=PurePosixPath(verdict.name).name)
            results.append(FileResult(member_name, _add(collection, verdict.name, file, user)))
        else:
            results.append(FileResult(member_name, skipped=verdict.reason))
    if not verdicts:
        results.append(FileResult(name, skipped=_("the zip holds no files")))
    return results


def _add(
    collection: Collection,
    name: str,
    file: UploadedFile[bytes] | ContentFile[bytes],
    user: User | None,
) -> Document:
    document = Document.objects.create(
        collection=collection,
        title=PurePosixPath(name).name[:300],
        file=file,
        size_bytes=file.size or 0,
        created_by=user,
    )
    enqueue_ingest(document)
    return document


def _too_many() -> str:
    return _("more than %(count)s files in one upload; upload the rest separately") % {
        "count": MAX_MEMBERS
    }
