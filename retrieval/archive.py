"""Unpacking an uploaded zip into the files to ingest, each with its own verdict.

A zip is untrusted: its listing is bounded before Python's zipfile parses it (central-directory
entries counted in the raw bytes), every member is read with a bound (zipfile never inflates a
member past its declared size: a lie fails its CRC check), and what all members unpack to is
bounded by `CACHET_MAX_UNPACKED_MB`. Member names are never used as paths on disk (the documents
are stored under their base name by Django's storage), and a name that would climb out of the
archive (`..`, absolute, a drive) is refused all the same, so a listing shows it was unsafe.
Links, encrypted members, hidden and system files and unsupported types are skipped, each with a
reason; the other members are ingested.
"""

from __future__ import annotations

import io
import re
import stat
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

from django.conf import settings
from django.utils.translation import gettext as _

from retrieval.extract import SUPPORTED_SUFFIXES

MB = 1024 * 1024
# A knowledge-base export has tens to hundreds of files; each listed entry costs memory.
MAX_MEMBERS = 1000
WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")


class ArchiveError(Exception):
    """The zip as a whole cannot be unpacked; the message is shown to the user as is."""


@dataclass(frozen=True, slots=True)
class Member:
    """A file of the archive to ingest: its path inside the archive and its bytes."""

    name: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Skipped:
    """A file left out, and why (in the request's language)."""

    name: str
    reason: str


def is_zip(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() == ".zip"


def unsupported_reason(name: str) -> str | None:
    """Why a file name cannot be ingested as a document, or None if its type is supported."""
    if PurePosixPath(name).suffix.lower() in SUPPORTED_SUFFIXES:
        return None
    return _("unsupported type; use %(types)s") % {"types": ", ".join(SUPPORTED_SUFFIXES)}


def too_large_reason(size: int) -> str | None:
    """Why a file of `size` bytes cannot be a document (CACHET_MAX_UPLOAD_MB), or None."""
    if size <= settings.CACHET_MAX_UPLOAD_MB * MB:
        return None
    return _("larger than the %(limit)s MB limit") % {"limit": settings.CACHET_MAX_UPLOAD_MB}


def unpack(data: bytes) -> Iterator[Member | Skipped]:
    """The archive's files in order; raises ArchiveError if the zip cannot be read at all."""
    if data.count(b"PK\x01\x02") > MAX_MEMBERS:
        raise ArchiveError(
            _("The zip holds more than %(count)s files; split it.") % {"count": MAX_MEMBERS}
        )
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as error:
        raise ArchiveError(
            _("The zip is corrupt or not a zip file (%(error)s).") % {"error": error}
        ) from None
    budget = settings.CACHET_MAX_UNPACKED_MB * MB
    with archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            verdict = _read(archive, info, budget)
            if isinstance(verdict, Member):
                budget -= len(verdict.data)
            yield verdict


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: int) -> Member | Skipped:
    name = info.filename
    reason = _refusal(info)
    if reason is not None:
        return Skipped(name, reason)
    if too_large := too_large_reason(info.file_size):
        return Skipped(name, too_large)
    if info.file_size > budget:
        return Skipped(
            name,
            _("the zip unpacks to more than %(limit)s MB (CACHET_MAX_UNPACKED_MB)")
            % {"limit": settings.CACHET_MAX_UNPACKED_MB},
        )
    try:
        with archive.open(info) as member:
            data = member.read(info.file_size + 1)
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        zlib.error,
        ValueError,
        OSError,
        EOFError,
    ) as error:
        return Skipped(name, _("damaged in the zip (%(error)s)") % {"error": error})
    if len(data) > info.file_size:  # pragma: no cover - zipfile checks sizes itself
        return Skipped(name, _("damaged in the zip (its size is wrong)"))
    return Member(name, data)


def _refusal(info: zipfile.ZipInfo) -> str | None:
    name = info.filename
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or WINDOWS_DRIVE.match(name) or ".." in parts:
        return _("unsafe path (it points outside the zip)")
    if stat.S_ISLNK(info.external_attr >> 16):
        return _("a link, not a file")
    if info.flag_bits & 0x1:
        return _("encrypted")
    if parts[0] == "__MACOSX" or any(part.startswith(".") for part in parts):
        return _("a hidden or system file")
    return unsupported_reason(name)
